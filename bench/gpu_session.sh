#!/usr/bin/env bash
# One lease on the lent GPU machine (offline): build Hypura with CUDA from the carried source,
# install the carried wheels beside the image's Python, run the GPU tests and, with
# HYPURA_PROFILE=1, the machine profile. Logs and results go to $OUT.
# Here first: mkdir -p .anchors .whl .device; cp ../shared/anchors/* .anchors/; wheels of
# cffi, pycparser, gguf, diskcache and llama-cpp-python (built with LLAMA_BUILD=OFF) in .whl;
# `hypura synth tiny-qwen3moe .device/tiny-qwen3moe.gguf` (and tiny-llama). There, with carry
# [".anchors", ".whl", ".device"]:  bash bench/gpu_session.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export HYPURA_LLAMA_SRC=$PWD/.anchors/llamacpp-src.tar.xz HYPURA_BACKEND=cuda CUDA_ARCHS=90
export HYPURA_CACHE=/tmp/hypura-cache HYPURA_BUILD_TARGETS=${HYPURA_BUILD_TARGETS:-llama}
export PYTHONUNBUFFERED=1 HYPURA_GPU_TEST_MODEL=$PWD/.device/tiny-qwen3moe.gguf HYPURA_GPU_TEST_DENSE=$PWD/.device/tiny-llama.gguf
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv | tee "$OUT/gpu.txt"
start=$SECONDS
lib=$(./build.sh lib 2> "$OUT/build.log") || { tail -40 "$OUT/build.log"; exit 1; }
echo "build: $((SECONDS - start)) s, lib: $lib" | tee -a "$OUT/summary.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD HYPURA_LIB_DIR=$lib
# the image's pytest plugins may import numpy before hypura loads our library: that order crashes llama.cpp's
# std::regex there (bench/gpu_import_order.py), so plugins stay off and conftest loads us first
if [ -z "${HYPURA_SKIP_TESTS:-}" ]; then
    HYPURA_GPU_TESTS=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python3 -m pytest -v -rA -p no:cacheprovider \
        tests/test_gpu_placement.py 2>&1 | tee "$OUT/pytest-gpu.txt" | tail -8
fi
if [ -n "${HYPURA_PROFILE:-}" ]; then
    # the CPU decode rate needs a model: a 16-layer llama3.1-8b-shaped one, tokenizer carried
    python3 -m hypura.cli.main synth llama3.1-8b /tmp/l8.gguf --layers 16 \
        --tokenizer-from .device/tiny-llama.gguf | tee -a "$OUT/summary.txt"
    timeout 240 python3 -m hypura.cli.main profile --force --json --path /tmp --model /tmp/l8.gguf \
        > "$OUT/profile.json" 2> "$OUT/profile.err"
    tail -5 "$OUT/profile.err"; cat "$OUT/profile.json"
fi
