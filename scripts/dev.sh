#!/usr/bin/env bash
# One entry point for a fresh machine of this project's kind (CPU, Linux, Python >= 3.10):
#   bash scripts/dev.sh train   # set up, then the main job: train the example hybrid LM (a few minutes on CPU)
#   bash scripts/dev.sh check   # set up, then check every operator against its reference
#   bash scripts/dev.sh test    # set up, then the unit tests and the ATK accuracy suite (Triton kernels under
#                               # the CPU interpreter); extra arguments go to pytest (then no ATK run; test
#                               # paths among them replace the whole suite)
#   bash scripts/dev.sh setup   # only the set-up
# Set-up makes ./.venv with torch 2.13.0 (CPU), triton 3.6.0 and numpy<2.4 (numpy >= 2.4 breaks the
# Triton interpreter's runtime-bounded loops), then installs this project with its test/bench/hf extras
# (hf: transformers, for the integration tests).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${MINDSPEED_OPS_VENV:-.venv}

setup() {
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
  fi
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==2.13.0" "triton==3.6.0" "numpy<2.4" 2>&1 \
    | grep -v "is ignored: it is neither" || true
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[test,bench,hf]" 2>&1 \
    | grep -v "is ignored: it is neither" || true
  "$VENV/bin/python" -c "import torch, triton, numpy; print(f'torch {torch.__version__}, triton {triton.__version__}, numpy {numpy.__version__}')"
}

# The ATK CPU accuracy suite in two processes, one core each, then one merged report; fails if either half has a
# failed check. Halves of about equal time on the CI machine (fifteenth session, seconds alone: gdn 134, kda 135,
# conv 22, loss 22, mhc 20, norm 13, moe 8, activation and rope a few): gdn loss mhc moe, and every other family.
atk_cpu() {
  local out="${TMPDIR:-/tmp}/mindspeed-ops-atk-cpu" first="gdn loss mhc moe" rest rc_a=0 rc_b=0
  rest=$("$VENV/bin/python" -c "from mindspeed_ops.atk.schema import load_specs
print(' '.join(sorted({s.family for s in load_specs()} - set('$first'.split()))))")
  rm -rf "$out" && mkdir -p "$out"
  # shellcheck disable=SC2086  # one family per word
  "$VENV/bin/mindspeed-ops" atk --suite accuracy --families $first --no-plots --out "$out/a" >"$out/a.log" 2>&1 &
  local pid_a=$!
  # shellcheck disable=SC2086
  "$VENV/bin/mindspeed-ops" atk --suite accuracy --families $rest --no-plots --out "$out/b" >"$out/b.log" 2>&1 &
  local pid_b=$!
  wait "$pid_a" || rc_a=$?
  wait "$pid_b" || rc_b=$?
  for half in a b; do  # the failed rows if any, then each half's summary
    grep -E "FAIL|ERROR|Traceback" "$out/$half.log" || true
    tail -n 2 "$out/$half.log"
  done
  "$VENV/bin/mindspeed-ops" atk --from-json "$out/a/report.json" "$out/b/report.json" --no-plots --out "$out" \
    | tail -n 3
  [ "$rc_a" -eq 0 ] && [ "$rc_b" -eq 0 ]
}

cmd=${1:-test}
shift || true
case "$cmd" in
  setup) setup ;;
  train) setup; exec "$VENV/bin/mindspeed-ops" train "$@" ;;
  check) setup; exec "$VENV/bin/mindspeed-ops" check "$@" ;;
  test)
    setup
    # No GPU here: tests/conftest.py turns on TRITON_INTERPRET=1 so the real kernels run on CPU.
    export OMP_NUM_THREADS=1
    local_paths=tests  # the whole suite, unless an argument names a test file or directory (path[::test])
    for a in "$@"; do
      if [[ $a != -* && -e ${a%%::*} ]]; then local_paths=""; fi
    done
    # shellcheck disable=SC2086  # empty when the arguments name their own paths
    "$VENV/bin/python" -m pytest -n 2 --dist worksteal -q -p no:cacheprovider $local_paths "$@"
    if [ $# -eq 0 ]; then  # the whole suite: also every operator's ATK accuracy cases at CPU size (~3 min)
      atk_cpu
    fi ;;
  *) echo "usage: bash scripts/dev.sh [setup|train|check|test] [args...]" >&2; exit 2 ;;
esac
