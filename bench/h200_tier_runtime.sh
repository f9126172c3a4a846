#!/usr/bin/env bash
# The tier runtime's evidence on the lent H200 (issue #4), in two device calls made back to back
# (the machine stays warm 30 s between calls; /tmp survives while it does):
#   bash bench/h200_tier_runtime.sh setup        # synth models (background), CUDA build, GPU tests
#   bash bench/h200_tier_runtime.sh zero|contention|hybrid|disk   # the measurements, below
# carry [".anchors", ".whl", ".device"]. One build serves both sides: our patched library with no
# hooks installed is llama.cpp itself (the hooks only act when Hypura installs them).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export HYPURA_LLAMA_SRC=$PWD/.anchors/llamacpp-src.tar.xz HYPURA_BACKEND=cuda CUDA_ARCHS=90
export HYPURA_CACHE=/tmp/hypura-cache HYPURA_BUILD_TARGETS="llama llama-bench"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
M70=/tmp/l70.gguf M14=/tmp/q14.gguf PROFILE=bench/results/h200-profile-2026-12-02.json T=16
TOK=.device/tiny-llama.gguf
hy() { python3 -m hypura.cli.main "$@"; }

case "${1:?setup|bench}" in
setup)
    nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv | tee "$OUT/gpu.txt"
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
    # the models: written in the background while the library builds
    setsid nohup bash -c "python3 -m hypura.cli.main synth llama3.3-70b $M70 --tokenizer-from $TOK > /tmp/synth70.log 2>&1;
        python3 -m hypura.cli.main synth qwen2.5-14b $M14 --tokenizer-from $TOK > /tmp/synth14.log 2>&1; echo done > /tmp/synth.rc" \
        > /dev/null 2>&1 &
    start=$SECONDS
    lib=$(./build.sh lib 2> "$OUT/build.log") || { tail -40 "$OUT/build.log"; exit 1; }
    echo "build: $((SECONDS - start)) s, lib: $lib" | tee -a "$OUT/summary.txt"
    echo "$lib" > /tmp/hypura-lib
    HYPURA_LIB_DIR=$lib HYPURA_GPU_TESTS=1 HYPURA_GPU_TEST_MODEL=$PWD/.device/tiny-qwen3moe.gguf \
        HYPURA_GPU_TEST_DENSE=$PWD/$TOK PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 \
        python3 -m pytest -v -rA -p no:cacheprovider tests/test_gpu_placement.py 2>&1 | tee "$OUT/pytest-gpu.txt" | tail -15
    cat /tmp/synth70.log /tmp/synth14.log 2>/dev/null | tail -3
    ;;
zero)  # everything resident: llama-bench (same build, hooks off) vs hypura bench
    lib=$(cat /tmp/hypura-lib); export HYPURA_LIB_DIR=$lib
    while [ ! -f /tmp/synth.rc ]; do sleep 5; done
    "$lib/llama-bench" -m $M14 -ngl 99 -p 512 -n 128 -r 3 -o json > "$OUT/vanilla-q14-ngl99.json" 2> /dev/null
    hy bench $M14 -p 512 -n 128 -r 3 -t $T --json "$OUT/hypura-q14-resident.json" 2>&1 | tail -3
    ;;
contention)  # do pinned host->GPU copies slow the CPU's decode?
    lib=$(cat /tmp/hypura-lib); export HYPURA_LIB_DIR=$lib
    python3 bench/ram_contention.py "$lib/llama-bench" $M70 "$OUT/ram-contention.json" | tail -12
    ;;
hybrid)  # (a) 8 GiB GPU, 64 GiB RAM: vanilla partial offload vs plans (auto, then diagnostic variants)
    lib=$(cat /tmp/hypura-lib); export HYPURA_LIB_DIR=$lib
    "$lib/llama-bench" -m $M70 -ngl 14 -t $T -p 0 -n 16 -r 3 -o json > "$OUT/vanilla-l70-ngl14.json" 2> /dev/null
    grep -o '"avg_ts": [0-9.]*' "$OUT/vanilla-l70-ngl14.json"
    for v in ${VARIANTS:-auto}; do
        echo "== $v"
        hy bench $M70 --plan bench/plans/l70-g8-r64-$v.json -p 0 -n ${NGEN:-8} -r 2 -t $T \
            --json "$OUT/hypura-l70-g8-r64-$v.json" 2>&1 | tail -3
    done
    ;;
auto)  # (a) with the plan the planner makes from the budgets
    lib=$(cat /tmp/hypura-lib); export HYPURA_LIB_DIR=$lib
    hy bench $M70 --gpu-mem 8GiB --ram 64GiB -p 0 -n ${NGEN:-8} -r 2 -t $T --profile $PROFILE \
        --json "$OUT/hypura-l70-g8-r64-planner.json" 2>&1 | tail -4
    ;;
facts)
    { lscpu | grep -iE "numa|model name|^cpu\(s\)"; df -h /tmp; free -g; } | tee "$OUT/machine.txt"
    ;;
disk)  # (b) 8 GiB GPU, 16 GiB RAM: part of the model streams from disk, page cache dropped first
    lib=$(cat /tmp/hypura-lib); export HYPURA_LIB_DIR=$lib
    sync; echo 3 > /proc/sys/vm/drop_caches
    hy bench $M70 --gpu-mem 8GiB --ram 16GiB -p 0 -n 3 -r 2 -t $T --profile $PROFILE \
        --json "$OUT/hypura-l70-g8-r16.json" 2>&1 | tail -4
    ;;
esac
