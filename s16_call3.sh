source scripts/site_env.sh && site_install || exit 1
export TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1
mkdir -p $OUT/r
timeout 90 python3 ab_conv.py > $OUT/r/ab_conv_final.txt 2>&1
timeout 110 python3 -m mindspeed_ops.cli atk --ops causal_conv1d --quick --suite performance memory --cases 'qwen3-next conv' --no-plots --out $OUT/r/atk_conv > $OUT/r/atk_conv.log 2>&1
timeout 300 python3 -m pytest -n 12 -q -p no:cacheprovider tests/unit_tests/conv > $OUT/r/pytest_conv.txt 2>&1
cd $OUT && tar czf r.tgz r
