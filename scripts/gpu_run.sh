#!/usr/bin/env bash
# What we run on the H200 through the device tool (see docs/benchmarks/README.md):
#   bash scripts/gpu_run.sh [tests|check|bench|all] [extra pytest args]
# Peer libraries travel as wheels in .whl/ (carry it); the image has torch, triton, pytest, rich.
set -uo pipefail
what=${1:-all}; shift || true
case $what in  # a typo (or a test path in place of the mode) used to run nothing and exit 0
  tests|check|bench|all) ;;
  *) echo "gpu_run.sh: unknown mode '$what' (tests, check, bench or all; extra pytest args after it)" >&2; exit 2 ;;
esac
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache} MINDSPEED_OPS_FAILLOG=${MINDSPEED_OPS_FAILLOG:-$OUT/failures.txt} \
  MINDSPEED_OPS_MEMLOG=${MINDSPEED_OPS_MEMLOG:-$OUT/peak_memory.txt} MINDSPEED_OPS_DURLOG=${MINDSPEED_OPS_DURLOG:-$OUT/durations.txt}
source "$(dirname "$0")/site_env.sh" && site_install || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
rc=0
if [[ $what == tests || $what == all ]]; then
  # -v into the log: PASSED/FAILED lines arrive as tests finish, so a run cut short still names its failures
  # [large] cases (> 2^31 elements) and [bigmem] ones (tens of GB each) run two at a time after the rest, which runs 8-wide;
  # [exclusive] ones alone at the end
  python3 -m pytest -v -p no:cacheprovider -n 8 --timeout 300 -rfE -m "not large and not bigmem" --junitxml="$OUT/junit.xml" \
    "${@:-tests}" > "$OUT/pytest.log" 2>&1
  rc=$(( rc | $? ))
  python3 -m pytest -v -p no:cacheprovider -n 2 --timeout 300 -rfE -m "(large or bigmem) and not exclusive" \
    --junitxml="$OUT/junit_large.xml" "${@:-tests}" >> "$OUT/pytest.log" 2>&1
  r=$?; (( r == 5 )) || rc=$(( rc | r ))  # 5: no [large]/[bigmem] case among the selected tests
  # [exclusive] cases need most of the GPU's memory: one at a time, nothing beside them
  python3 -m pytest -v -p no:cacheprovider -n 0 --timeout 400 -rfE -m exclusive "${@:-tests}" >> "$OUT/pytest.log" 2>&1
  r=$?; (( r == 5 )) || rc=$(( rc | r ))
  grep -E "^(FAILED|ERROR)|(FAILED|ERROR) tests/" "$OUT/pytest.log" | sort -u | head -60
  grep -E "^=+ .*(passed|failed|error)" "$OUT/pytest.log"
fi
if [[ $what == check || $what == all ]]; then
  python3 -m mindspeed_ops check --json "$OUT/check.json" 2>&1 | tee "$OUT/check.log" | tail -60
  rc=$(( rc | ${PIPESTATUS[0]} ))
fi
if [[ $what == bench || $what == all ]]; then
  python3 benchmarks/bench_norms_activation_rope.py --out "$OUT/bench" 2>&1 | tee "$OUT/bench.log" | tail -80
  rc=$(( rc | ${PIPESTATUS[0]} ))
fi
exit $rc
