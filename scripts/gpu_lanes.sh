#!/usr/bin/env bash
# Several independent job lists on a machine of several GPUs (device kind nvidia-h200-x2 or more), one per GPU:
#   bash scripts/gpu_lanes.sh LIMIT_S "commands for GPU 0" "commands for GPU 1" ...
# Installs the carried wheels and site bundles once (scripts/site_env.sh; gpu_run.sh in a lane then skips it),
# runs lane i with CUDA_VISIBLE_DEVICES=i and OUT=/tmp/lane<i> under `timeout LIMIT_S`, then packs every
# lane's logs into $OUT/lanes.tar.gz (the device tool returns at most 8 files) and prints each lane's tail.
# Exits non-zero when any lane did (a timeout is 124). LANE_ROOT (default /tmp) holds the lane folders.
# Timings taken while another lane runs share the host's CPUs: say so wherever such a figure is reported.
set -uo pipefail
if (( $# < 2 )); then
  echo "usage: bash scripts/gpu_lanes.sh LIMIT_S \"commands for GPU 0\" [\"commands for GPU 1\" ...]" >&2
  exit 2
fi
OUT=${OUT:-out}; mkdir -p "$OUT"
root=${LANE_ROOT:-/tmp}
limit=$1; shift
if command -v nvidia-smi >/dev/null 2>&1 && (( $# > $(nvidia-smi -L | wc -l) )); then
  echo "gpu_lanes.sh: $# lanes but $(nvidia-smi -L | wc -l) GPU(s): a lane without a GPU would run on the CPU" >&2
  exit 2
fi
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
source "$(dirname "$0")/site_env.sh" && site_install || exit 1  # once for all lanes
i=0; pids=(); lanes=()
for cmds in "$@"; do
  d=$root/lane$i
  rm -rf "$d" && mkdir -p "$d" || exit 1  # nothing of an earlier run on this machine is packed as this run's
  ( export CUDA_VISIBLE_DEVICES=$i OUT=$d MINDSPEED_OPS_FAILLOG=$d/failures.txt \
      MINDSPEED_OPS_MEMLOG=$d/peak_memory.txt MINDSPEED_OPS_DURLOG=$d/durations.txt
    timeout "$limit" bash -c "$cmds" > "$d/lane.log" 2>&1; r=$?; echo "lane $i rc $r" >> "$d/lane.log"; exit $r ) &
  pids+=($!); lanes+=(lane$i); i=$((i + 1))
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
tar -C "$root" -czf "$OUT/lanes.tar.gz" "${lanes[@]}" || rc=1  # this run's lanes only (not e.g. OUT=/tmp/lanes_out)
for ((j = 0; j < i; j++)); do echo "== lane $j"; tail -n 25 "$root/lane$j/lane.log"; done
exit $rc
