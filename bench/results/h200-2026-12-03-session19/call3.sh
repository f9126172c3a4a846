#!/usr/bin/env bash
# session 19, call 3: bench/zero_copy_contention.py. llama.cpp (-ngl 0, every weight on the CPU, 15 cores) decodes
# the q3u shape alone and while a GPU kernel reads random experts from pinned host memory (its thread on core 16),
# ABBA, 3 pairs. Call 2 ran llama.cpp on all 16 cores beside the load thread: 8x slower (oversubscription).
# Predicted: llama.cpp keeps 0.85-0.95 of its rate, the kernel 0.9-1.0 of its 50.5 GB/s, so the split's ceiling
# lands at 1.40-1.55x (1.61x if both kept everything).
#   bash .device/s19call2.sh > $OUT/log.txt 2>&1     carry [".whl", ".device", ".prebuilt"]
S=bench/h200_tier_runtime.sh; export SYNTH70=0 SYNTH14=0 T=16
t0=$SECONDS; log() { echo "=== $1 at $((SECONDS - t0)) s"; }
rm -rf /tmp/res; bash $S setup | tail -3; log setup
export PYTHONPATH=/tmp/site:$PWD LD_LIBRARY_PATH=$(cat /tmp/hypura-lib)
python3 -m hypura.cli.main synth qwen3-30b-a3b /tmp/q3u.gguf --block-out-scale 0.002 \
    --tokenizer-from .device/tiny-llama.gguf > /tmp/res/synth-q3u.log 2>&1; log synth
timeout 400 python3 bench/zero_copy_contention.py $(cat /tmp/hypura-lib)/llama-bench /tmp/q3u.gguf \
    /tmp/res/zero-copy-contention.json 3; log contention
bash $S pack > /dev/null
