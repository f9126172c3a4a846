#!/usr/bin/env bash
# One lease on the lent GPU machine (offline): build Hypura with CUDA from the carried source,
# install the carried wheels beside the image's Python, run the GPU tests and the machine
# profile. Logs and results go to $OUT. There, with carry [".anchors", ".whl", ".device"]:
#   bash bench/gpu_session.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export HYPURA_LLAMA_SRC=$PWD/.anchors/llamacpp-src.tar.xz HYPURA_BACKEND=cuda CUDA_ARCHS=90
export HYPURA_CACHE=/tmp/hypura-cache HYPURA_BUILD_TARGETS=${HYPURA_BUILD_TARGETS:-llama}
export PYTHONUNBUFFERED=1 HYPURA_GPU_TEST_MODEL=$PWD/.device/tiny-qwen3moe.gguf
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv | tee "$OUT/gpu.txt"
start=$SECONDS
lib=$(./build.sh lib 2> "$OUT/build.log") || { tail -40 "$OUT/build.log"; exit 1; }
echo "build: $((SECONDS - start)) s, lib: $lib" | tee -a "$OUT/summary.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD HYPURA_LIB_DIR=$lib
if [ -n "${HYPURA_DEBUG_LOAD:-}" ]; then
    timeout 300 python3 bench/gpu_debug_load.py "$HYPURA_GPU_TEST_MODEL" 2>&1 | tee "$OUT/debug-load.txt" | grep -A45 "==="
fi
HYPURA_GPU_TESTS=1 python3 -m pytest -q -rA -p no:cacheprovider tests/test_gpu_placement.py 2>&1 | tee "$OUT/pytest-gpu.txt" | tail -15
if grep -q "Segmentation fault\|Fatal Python" "$OUT/pytest-gpu.txt"; then
    echo "=== the same tests outside pytest"
    timeout 120 python3 -X faulthandler -c "import os, tests.test_gpu_placement as t; m = os.environ['HYPURA_GPU_TEST_MODEL']
for f in (t.test_default_policy_places_exactly_as_llama_cpp, t.test_override_experts_to_cpu, t.test_explicit_tiers_and_deferred_gpu_tensors):
    f(m); print('PASSED', f.__name__)" 2>&1 | grep -v "^  File" | tail -12
    echo "=== pytest under cuda-gdb"
    HYPURA_GPU_TESTS=1 timeout 240 cuda-gdb -batch -ex run -ex "bt 30" --args python3 -m pytest -x -q -p no:faulthandler -p no:cacheprovider tests/test_gpu_placement.py 2>&1 | grep -v "^\[New Thread\|^\[Thread" | tail -45
fi
if [ -n "${HYPURA_PROFILE:-}" ]; then
    timeout 180 python3 -m hypura.cli.main profile --force --json --path /tmp > "$OUT/profile.json" 2> "$OUT/profile.err"
    tail -5 "$OUT/profile.err"; cat "$OUT/profile.json"
fi
