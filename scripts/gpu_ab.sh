#!/usr/bin/env bash
# A/B of git refs in one device call: the same commands run on every ref's tree (from `git archive`), each with
# PYTHONPATH pointing at that tree, so a branch and main are timed side by side on one machine and one GPU state.
#   here:    bash scripts/gpu_ab.sh pack main my-branch
#            -> .ab/<name>.tar per ref (name: the ref with / as _), .ab/refs (the order); .ab/ is git-ignored, so
#               give the device tool carry [".ab"]
#   device:  bash scripts/gpu_ab.sh run LIMIT_S "command 1" ["command 2" ...]
# `run` installs the carried wheels and bundles once (scripts/site_env.sh), extracts each tree into $AB_ROOT/<name>
# (default /tmp/ab), then for each command, each ref in the packed order: `timeout LIMIT_S bash -c "<command>"` run
# from that tree into $OUT/ab/<k>_<name>.txt (k: the command's number, from 1; a later `run` in the same call goes
# on from the last k there). Keep a command's output unpiped: a pipe such as `| tail` dies with the `timeout` and
# takes everything with it. Each file starts with the ref, its
# commit and the mindspeed_ops that Python imports there (a wrong PYTHONPATH shows at once). A command finds the
# ref's name in $AB_REF and the output folder in $AB_OUT (for its own files: --out \$AB_OUT/\$AB_REF). Exits non-zero
# when any run did (a timeout is 124).
set -uo pipefail
usage() {
  echo "usage: bash scripts/gpu_ab.sh pack REF [REF ...] | run LIMIT_S \"command\" [\"command\" ...]" >&2
  exit 2
}
(( $# >= 1 )) || usage
mode=$1; shift
case $mode in
  pack)
    (( $# >= 1 )) || usage
    rm -rf .ab && mkdir -p .ab || exit 1
    for ref in "$@"; do
      name=${ref//\//_}
      commit=$(git rev-parse --short "$ref^{commit}") || { echo "gpu_ab.sh: not a commit: $ref" >&2; exit 2; }
      # without docs/ (raw benchmark outputs: ~13 of 16 MB), so several trees fit the device tool's 64 MiB carry
      git archive --format=tar -o ".ab/$name.tar" "$ref" -- . ':(exclude)docs' || exit 1
      echo "$name $commit" >> .ab/refs
    done
    cat .ab/refs ;;
  run)
    (( $# >= 2 )) || usage
    [[ -s .ab/refs ]] || { echo "gpu_ab.sh: no .ab/refs: run 'pack' here first and carry .ab" >&2; exit 2; }
    limit=$1; shift
    OUT=${OUT:-out}; mkdir -p "$OUT/ab"
    export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
    source "$(dirname "$0")/site_env.sh" && site_install || exit 1
    root=${AB_ROOT:-/tmp/ab}; out=$(cd "$OUT/ab" && pwd)
    while read -r name commit; do
      rm -rf "${root:?}/$name" && mkdir -p "$root/$name" && tar -xf ".ab/$name.tar" -C "$root/$name" || exit 1
    done < .ab/refs
    # a second `run` in one device call numbers its commands after the first's (it overwrote 1_<ref>.txt before)
    k=$(find "$out" -maxdepth 1 -name '[0-9]*_*.txt' -printf '%f\n' | cut -d_ -f1 | sort -n | tail -1)
    rc=0; k=${k:-0}
    for cmd in "$@"; do
      k=$((k + 1))
      while read -r name commit; do
        tree=$root/$name; f=$out/${k}_$name.txt
        (
          cd "$tree" || exit 1
          export PYTHONPATH=$tree${PYTHONPATH:+:$PYTHONPATH}  # the tree first: its package, not the working tree's
          export AB_REF=$name AB_OUT=$out  # for a command's own files: --out \$AB_OUT/\$AB_REF
          echo "# ref $name commit $commit: $cmd"
          python3 -c "import mindspeed_ops; print('# mindspeed_ops from', mindspeed_ops.__file__)" 2>&1
          timeout "$limit" bash -c "$cmd" 2>&1
        ) > "$f"
        r=$?; echo "command $k ref $name rc $r"; (( r == 0 )) || rc=1
      done < .ab/refs
    done
    exit $rc ;;
  *) usage ;;
esac
