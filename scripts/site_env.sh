# Sourced by scripts/gpu_run.sh and scripts/gpu_lanes.sh: puts the carried peer wheels (.whl/*.whl) and site
# bundles (.whl/*.tar.xz from scripts/make_tilelang_bundle.sh, make_transformers_bundle.sh; BUNDLES="" skips
# them) into /tmp/site, sets PYTHONPATH, and marks it done (SITE_READY) so a nested script does not repeat it.
site_install() {
  [[ -n ${SITE_READY:-} ]] && return 0
  export PYTHONPATH=$PWD
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      || return 1
    export PYTHONPATH=/tmp/site:$PWD
  fi
  local b
  for b in ${BUNDLES-.whl/*.tar.xz}; do
    [[ -e $b ]] || continue
    mkdir -p /tmp/site && tar -C /tmp/site -xJf "$b" || return 1
    export PYTHONPATH=/tmp/site:$PWD
  done
  export SITE_READY=1
}
