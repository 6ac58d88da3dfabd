#!/usr/bin/env bash
# Several independent job lists on a machine of several GPUs (device kind nvidia-h200-x2 or more), one per GPU:
#   bash scripts/gpu_lanes.sh LIMIT_S "commands for GPU 0" "commands for GPU 1" ...
# Installs the carried wheels and site bundles once (gpu_run.sh then skips its own install: SITE_READY),
# runs lane i with CUDA_VISIBLE_DEVICES=i and OUT=/tmp/lane<i> under `timeout LIMIT_S`, then packs every
# lane's logs into $OUT/lanes.tar.gz (the device tool returns at most 8 files) and prints each lane's tail.
# Timings taken while another lane runs share the host's CPUs: say so wherever such a figure is reported.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
limit=$1; shift
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache} PYTHONPATH=$PWD
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
for b in ${BUNDLES-.whl/*.tar.xz}; do
  [[ -e $b ]] || continue
  mkdir -p /tmp/site && tar -C /tmp/site -xJf "$b" && export PYTHONPATH=/tmp/site:$PWD || exit 1
done
export SITE_READY=1
i=0; pids=()
for cmds in "$@"; do
  mkdir -p /tmp/lane$i
  ( export CUDA_VISIBLE_DEVICES=$i OUT=/tmp/lane$i MINDSPEED_OPS_FAILLOG=/tmp/lane$i/failures.txt \
      MINDSPEED_OPS_MEMLOG=/tmp/lane$i/peak_memory.txt MINDSPEED_OPS_DURLOG=/tmp/lane$i/durations.txt
    timeout "$limit" bash -c "$cmds" > /tmp/lane$i/lane.log 2>&1; echo "lane $i rc $?" >> /tmp/lane$i/lane.log ) &
  pids+=($!); i=$((i + 1))
done
wait "${pids[@]}"
tar -C /tmp -czf "$OUT/lanes.tar.gz" $(cd /tmp && ls -d lane*)
for ((j = 0; j < i; j++)); do echo "== lane $j"; tail -n 25 /tmp/lane$j/lane.log; done
