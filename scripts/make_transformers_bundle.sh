#!/usr/bin/env bash
# Build .whl/transformers-<ver>-py312-site.tar.xz: a `pip install --target` tree of transformers (the version the
# local env has) and the packages it needs that the lent H200's image may lack, for CPython 3.12 manylinux x86_64.
# The image has no network; scripts/gpu_run.sh unpacks .whl/*.tar.xz into /tmp/site, first on PYTHONPATH, so this
# transformers shadows the image's older one (5.17 in earlier reports, without DeepSeek-V4).
# usage: bash scripts/make_transformers_bundle.sh [PYTHON]   (PYTHON: the env to match; default .venv/bin/python)
set -euo pipefail
PY=${1:-.venv/bin/python}
# in the image: torch (brings typing_extensions, filelock, fsspec: bundled anyway, they are small), numpy, pyyaml,
# rich and its dependencies; everything else transformers needs comes along, pinned to the local versions
SKIP="torch numpy pyyaml rich pygments markdown-it-py mdurl"
PINS=$("$PY" - $SKIP <<'EOF'
import importlib.metadata as md, re, sys
from packaging.requirements import Requirement
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
skip, seen, todo = {norm(n) for n in sys.argv[1:]}, {}, ["transformers"]
while todo:  # the dependency closure (no extras) as it evaluates on CPython 3.12 / Linux
    name = norm(todo.pop())
    if name in seen or name in skip:
        continue
    dist = md.distribution(name)
    seen[name] = dist.version
    for r in map(Requirement, dist.requires or []):
        if r.marker is None or r.marker.evaluate({"extra": "", "python_version": "3.12", "sys_platform": "linux"}):
            todo.append(r.name)
print(" ".join(f"{n}=={v}" for n, v in sorted(seen.items())))
EOF
)
VER=$("$PY" -c "import transformers; print(transformers.__version__)")
OUT=.whl/transformers-$VER-py312-site.tar.xz
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
TAGS=(--python-version 3.12 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --only-binary=:all:)
echo "bundling: $PINS"
# shellcheck disable=SC2086
"$PY" -m pip download -q --no-deps "${TAGS[@]}" -d "$T/wheels" $PINS
"$PY" -m pip install -q --no-deps --no-index --no-compile --target "$T/site" "${TAGS[@]}" "$T"/wheels/*.whl
rm -rf "$T/site/bin"  # console scripts, with this interpreter's path in their shebang
find "$T/site" -name __pycache__ -prune -exec rm -rf {} +
mkdir -p .whl
tar -C "$T/site" -cf - . | xz -T0 -9 > "$OUT"
du -sh "$T/site" | sed 's/\t.*/ unpacked/'
ls -la "$OUT"
size=$(stat -c %s "$OUT")
(( size < 25 * 1024 * 1024 )) || { echo "bundle is over 25 MiB" >&2; exit 1; }
