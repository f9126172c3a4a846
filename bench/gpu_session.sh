#!/usr/bin/env bash
# One lease on the lent GPU machine (offline): build Hypura with CUDA from the carried source,
# install the carried wheels beside the image's Python, run the GPU tests and the machine
# profile. Logs and results go to $OUT. There, with carry [".anchors", ".whl"]:
#   bash bench/gpu_session.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export HYPURA_LLAMA_SRC=$PWD/.anchors/llamacpp-src.tar.xz HYPURA_BACKEND=cuda CUDA_ARCHS=90
export HYPURA_CACHE=/tmp/hypura-cache HYPURA_BUILD_TARGETS=${HYPURA_BUILD_TARGETS:-llama}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv | tee "$OUT/gpu.txt"
start=$SECONDS
lib=$(./build.sh lib 2> "$OUT/build.log") || { tail -40 "$OUT/build.log"; exit 1; }
echo "build: $((SECONDS - start)) s, lib: $lib" | tee -a "$OUT/summary.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD HYPURA_LIB_DIR=$lib
python3 -m pytest -q -rA -p no:cacheprovider tests/test_gpu_placement.py 2>&1 | tee "$OUT/pytest-gpu.txt" | tail -15
if python3 -c 'import hypura.cli.profile_cmd' 2>/dev/null; then
    timeout 120 python3 -m hypura.cli.main profile --force --json > "$OUT/profile.json" 2> "$OUT/profile.err"
    tail -5 "$OUT/profile.err"; cat "$OUT/profile.json"
fi
