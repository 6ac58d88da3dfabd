#!/usr/bin/env bash
# Build a compact TileLang runtime bundle (tilelang + tvm_ffi + z3) for the lent H200, whose image has
# no network and whose carry limit (64 MiB) the plain wheels exceed (~78 MiB).
# usage: bash scripts/make_tilelang_bundle.sh WHEEL_DIR .whl/tilelang-0.1.15-py312-site.tar.xz
#   WHEEL_DIR: `pip download --no-deps --python-version 3.12 --only-binary=:all: -d WHEEL_DIR \
#               tilelang==0.1.15 apache-tvm-ffi==0.1.12 "z3-solver<4.15.5"` (tilelang 0.1.15 pins z3 < 4.15.5) (the image runs Python 3.12)
# scripts/gpu_run.sh unpacks .whl/*.tar.xz next to the peer wheels (~35 MiB bundle).
set -euo pipefail
W=$1; OUT=$2
S=$(mktemp -d)/site; mkdir -p "$S"
unzip -q "$W"/tilelang-*.whl -d "$S"
unzip -q "$W"/apache_tvm_ffi-*.whl -d "$S"
unzip -q "$W"/z3_solver-*.whl 'z3/*' 'z3_solver-*.dist-info/*' -d "$S"
# z3: keep one stripped copy of the shared library (the wheel ships libz3.so and a versioned copy, unstripped)
# (the versioned name differs between z3 releases: libz3.so.4.15, libz3.so.5.4, ...)
lib=$(cd "$S"/z3/lib && ls libz3.so.* | head -n 1)
strip --strip-unneeded "$S/z3/lib/$lib"
rm -f "$S"/z3/lib/libz3.so && ln -s "$lib" "$S"/z3/lib/libz3.so
rm -rf "$S"/z3/include
find "$S" -name RECORD -path '*dist-info*' -delete
tar -C "$S" -cf - . | xz -T0 -9 > "$OUT"
ls -la "$OUT"; du -sh "$S"
