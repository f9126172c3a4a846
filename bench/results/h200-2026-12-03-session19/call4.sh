#!/usr/bin/env bash
# session 19, call 4: bench/zero_copy_contention.py with the copy engine as the load (the control). Call 3: under a
# zero-copy kernel reading 43 GB/s, llama.cpp -ngl 0 -t 15 kept 0.12 of its rate. Predicted here: 0.8-0.9 (an older
# bench, ram_contention.py, saw ~60 of ~70 GB/s beside 43 GB/s of copies), so the collapse is zero-copy's own.
#   bash .device/s19call2.sh > $OUT/log.txt 2>&1     carry [".whl", ".device", ".prebuilt"]
S=bench/h200_tier_runtime.sh; export SYNTH70=0 SYNTH14=0 T=16
t0=$SECONDS; log() { echo "=== $1 at $((SECONDS - t0)) s"; }
rm -rf /tmp/res; bash $S setup | tail -3; log setup
export PYTHONPATH=/tmp/site:$PWD LD_LIBRARY_PATH=$(cat /tmp/hypura-lib)
python3 -m hypura.cli.main synth qwen3-30b-a3b /tmp/q3u.gguf --block-out-scale 0.002 \
    --tokenizer-from .device/tiny-llama.gguf > /tmp/res/synth-q3u.log 2>&1; log synth
timeout 400 python3 bench/zero_copy_contention.py $(cat /tmp/hypura-lib)/llama-bench /tmp/q3u.gguf \
    /tmp/res/copy-engine-contention.json 2 copy-engine; log contention
bash $S pack > /dev/null
