#!/usr/bin/env bash
# The GPU smoke, first on any GPU machine: the library (prebuilt where it serves, else built), the GPU tests, two
# layer subsets of real shapes and a draft, the GPU tests on them, then bench/gpu_smoke.py's table of front ends x
# plans x prompts (serve -kvu among them: a dense streamed plan and an MoE pinned one, each request's greedy text
# the same without -kvu; `python3 bench/gpu_smoke.py --dry-run ...` runs those rows on a CPU host).
#   bash bench/gpu_smoke.sh          carry [".whl", ".device", ".prebuilt"] (bench/device_prep.sh; .anchors too
#                                    where no prebuilt library matches the patches)
# About 5 minutes after set-up. $OUT gets smoke.md (the table), smoke.json, the GPU tests' output (tiny models, and
# the subsets: pytest-gpu.txt, pytest-gpu-real-sizes.txt) and smoke-logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; LOGS=/tmp/smoke; mkdir -p "$OUT" "$LOGS"
export HYPURA_PIN_MAPPED=${HYPURA_PIN_MAPPED:-1}  # the mapped weights registered with the GPU: the path to prove
# each step once on a warm machine: a second run (after a time limit) goes on where the first stopped
[ -f /tmp/res/pytest-gpu.txt ] || { MODELS=0 bash bench/h200.sh setup || exit 1; }
cp /tmp/res/pytest-gpu.txt "$OUT/" 2> /dev/null
lib=$(cat /tmp/hypura-lib)
export HYPURA_LIB_DIR=$lib LD_LIBRARY_PATH=$lib PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export XDG_CACHE_HOME=/tmp/xdg-smoke  # no profile or routing of another run
D=/tmp/smoke-l70e6.gguf M=/tmp/smoke-q3e6.gguf DRAFT=/tmp/smoke-l70e6-draft.gguf
synth() { [ -f "$2" ] || python3 -m hypura.cli.main synth "$1" "$2" --layers 4 --tokenizer-from .device/tiny-llama.gguf \
    --block-out-scale 0.000001 > "$LOGS/synth-$1.log" 2>&1; }
t0=$SECONDS
synth llama3.3-70b $D & synth qwen3-30b-a3b $M & wait
[ -f $DRAFT ] || python3 -m hypura.cli.main synth --draft-for $D $DRAFT > "$LOGS/synth-draft.log" 2>&1
echo "models: $((SECONDS - t0)) s ($(du -h $D $M | awk '{print $1}' | paste -sd' '))"
t0=$SECONDS  # the GPU tests again on the subsets: each bitwise against vanilla, at real tensor sizes
[ -f $LOGS/pytest-gpu-real-sizes.txt ] && [ $LOGS/pytest-gpu-real-sizes.txt -nt $D ] || HYPURA_GPU_TESTS=1 HYPURA_GPU_TEST_MODEL=$M HYPURA_GPU_TEST_DENSE=$D \
    PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 timeout 300 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_gpu_placement.py \
    > $LOGS/pytest-gpu-real-sizes.txt 2>&1
cp $LOGS/pytest-gpu-real-sizes.txt "$OUT/"
echo "GPU tests at real tensor sizes: $(tail -1 "$OUT/pytest-gpu-real-sizes.txt"), $((SECONDS - t0)) s"
t0=$SECONDS
python3 bench/gpu_smoke.py --dense $D --moe $M --draft $DRAFT --bin "$lib" --out "$LOGS"
rc=$?
echo "smoke: $((SECONDS - t0)) s, exit $rc"
cp "$LOGS/smoke.md" "$LOGS/smoke.json" "$OUT/" 2> /dev/null
tar czf "$OUT/smoke-logs.tgz" -C "$LOGS" --exclude='*.gguf' . 2> /dev/null
exit $rc
