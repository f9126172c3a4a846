#!/usr/bin/env bash
# The ignored folders a device call carries (bench/h200_tier_runtime.sh), made on a bare checkout here, where
# pip reaches a registry; the lent GPU machine reaches none. Idempotent: what exists is kept.
#   bash bench/device_prep.sh [RESULTS_DIR]    RESULTS_DIR: a session's results folder whose s*.sh and summ.py
#                                              go to .device/ (default: the newest h200-*session* folder)
#   .anchors/  the trimmed llama.cpp source (../shared/anchors), for a CUDA build there
#   .whl/      wheels the machine's image lacks, for its Python 3.12 (llama-cpp-python without its library:
#              Hypura loads its own build)
#   .device/   tiny synthetic models for the GPU tests and as the tokenizer source, and the call scripts
# .prebuilt/ (a packed CUDA build) comes back from the first call that builds; copy its lib-*.part* files in.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || { echo "device_prep.sh: run ./build.sh first (needs $PY)" >&2; exit 1; }
grep -qx '/.prebuilt/' .git/info/exclude 2> /dev/null || echo /.prebuilt/ >> .git/info/exclude

[ -f .anchors/llamacpp-src.tar.xz ] || { mkdir -p .anchors && cp ../shared/anchors/* .anchors/; }

mkdir -p .whl
if ! ls .whl/cffi-*.whl > /dev/null 2>&1; then
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl cffi pycparser diskcache
    "$PY" -m pip download -q --no-deps -d .whl gguf
fi
ls .whl/llama_cpp_python-*.whl > /dev/null 2>&1 ||
    CMAKE_ARGS="-DLLAMA_BUILD=OFF" "$PY" -m pip wheel -q --no-deps -w .whl "llama-cpp-python==0.3.36"

mkdir -p .device
for shape in tiny-llama tiny-qwen3moe; do
    [ -f .device/$shape.gguf ] || "$PY" -m hypura.cli.main synth $shape .device/$shape.gguf > /dev/null
done
results=${1:-$(ls -d bench/results/h200-*session*/ | sort -V | tail -1)}
cp "$results"/s*.sh .device/ 2> /dev/null || true
summ=$(ls bench/results/h200-*/summ.py 2> /dev/null | sort -V | tail -1)
[ -z "$summ" ] || cp "$summ" .device/
for f in "$results"/next-*.sh; do [ -f "$f" ] && cp "$f" ".device/$(basename "$f" | sed 's/^next-//')"; done
echo "carry: $(ls -d .anchors .whl .device .prebuilt 2> /dev/null | tr '\n' ' ')"
du -sh .anchors .whl .device 2> /dev/null
