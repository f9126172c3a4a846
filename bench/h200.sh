#!/usr/bin/env bash
# The benchmarks behind bench/RESULTS.md's H200 tables, in phases that one command runs in order:
#   bash bench/h200.sh setup ab defaults ... pack
# carry [".anchors", ".whl", ".device", ".prebuilt", ".oldtree"] (bench/device_prep.sh makes them; .oldtree, an
# optional `git archive` of an earlier hypura/, is the other side of `ab`). One build serves both sides: our
# patched library with no hooks installed is llama.cpp itself, so llama-bench, llama-completion and
# llama-batched-bench from it are vanilla llama.cpp of the same source.
# `setup` packs a fresh build into $OUT (lib-<patch hash>.tar.xz.partNN); copied into .prebuilt/, the next
# machine skips the build. Results gather in $RES; `pack` archives them as $OUT/results.tgz.
#   phases: setup | ab | profile | defaults | loads | prefill | smoke | cgroup | batched-l70 | batched-q14 | batched-q3 |
#           perstep | vanilla-best | passes | ttft | pins | serve-np16 | serve | store | drafts | spec | spec-serve | rpc-gpu |
#           split-gpus (2+ GPUs) | bigmoe | pack
set -uo pipefail
OUT=${OUT:-/tmp/out}; RES=/tmp/res; mkdir -p "$OUT" "$RES"
export HYPURA_LLAMA_SRC=$PWD/.anchors/llamacpp-src.tar.xz HYPURA_BACKEND=cuda CUDA_ARCHS=90
export HYPURA_CACHE=/tmp/hypura-cache HYPURA_BUILD_TARGETS="llama llama-bench llama-completion llama-batched-bench llama-speculative-simple ggml-rpc-server"
export HYPURA_CMAKE_ARGS=-DLLAMA_BUILD_EXAMPLES=ON  # llama-speculative-simple is an example
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
export XDG_CACHE_HOME=/tmp/xdg  # a fresh machine: no cached profile, no recorded routing
# the 70B and the MoE model are read from disk (O_DIRECT); the resident 14B does not fit beside them
M70=/tmp/l70.gguf MQ3=/tmp/q3.gguf M14=/dev/shm/q14.gguf TOK=.device/tiny-llama.gguf
KEY=$(cat patches/*.patch | sha256sum | cut -c1-12)
GIB=$((1 << 30))
hy() { python3 -m hypura.cli.main "$@"; }
hycli() { python3 -m hypura.cli.completion "$@"; }
# the earlier tree from its own folder: `python3 -m` puts the working directory first on sys.path, so from the
# checkout's root it would import this tree's hypura whatever PYTHONPATH says
old() { (cd .oldtree && PYTHONPATH=/tmp/site python3 -m hypura.cli.main "$@"); }
libdir() { cat /tmp/hypura-lib; }
models_done() { while [ ! -f /tmp/synth.rc ]; do sleep 5; done; }
draft70() { echo /dev/shm/l70-d$1.gguf; }  # the synthetic drafts (setup's background job writes them there)
draftq3() { echo /dev/shm/q3-d0.8.gguf; }
drafts_done() { if [ -f /tmp/drafts.started ]; then while [ ! -f /tmp/drafts.rc ]; do sleep 5; done; else phase drafts; fi; }
drop_cache() { sync; echo 3 > /proc/sys/vm/drop_caches; }
note() { echo "$*" | tee -a "$RES/summary.txt"; }
tps() { grep -o '"avg_ts": [0-9.]*' "$1" | awk '{print $2}' | paste -sd' '; }

hold_gpu() {  # another process holds the GPU down to $1 GiB free (a torch allocation left alive)
    release_gpu
    setsid python3 -c "
import torch, time, sys
free, _ = torch.cuda.mem_get_info()
keep = int(float(sys.argv[1]) * (1 << 30))
x = torch.empty(free - keep, dtype=torch.uint8, device='cuda')
open('/tmp/gpu-held', 'w').write(str(torch.cuda.mem_get_info()[0]))
time.sleep(3600)" "$1" > /tmp/hold.log 2>&1 &
    echo $! > /tmp/hold.pid
    while [ ! -f /tmp/gpu-held ]; do sleep 1; done
    note "GPU held: $(( $(cat /tmp/gpu-held) / (1 << 20) )) MiB free"
}
release_gpu() { [ -f /tmp/hold.pid ] && kill "$(cat /tmp/hold.pid)" 2> /dev/null; rm -f /tmp/hold.pid /tmp/gpu-held; sleep 2; }

memory_cgroup() {  # a cgroup limited to $1 bytes of memory (page cache included); prints its folder
    local cg
    if grep -qw memory /sys/fs/cgroup/cgroup.controllers 2> /dev/null; then
        cg=/sys/fs/cgroup/hypura-budget; echo +memory > /sys/fs/cgroup/cgroup.subtree_control 2> /dev/null
        mkdir -p $cg && echo "$1" > $cg/memory.max && echo 0 > $cg/memory.swap.max 2> /dev/null; [ -f $cg/memory.max ] || return 1
    elif [ -f /sys/fs/cgroup/memory/memory.limit_in_bytes ]; then
        cg=/sys/fs/cgroup/memory/hypura-budget; mkdir -p $cg && echo "$1" > $cg/memory.limit_in_bytes || return 1
    else return 1; fi
    echo $cg
}
in_cgroup() { local cg=$1; shift; bash -c "echo \$\$ > $cg/cgroup.procs; exec $*"; }

phase() {
[ -f /tmp/hypura-lib ] && export HYPURA_LIB_DIR=$(libdir) LD_LIBRARY_PATH=$(libdir)  # a prebuilt one's RPATH is gone
case "$1" in
setup)  # wheels, models (in the background), the library (prebuilt or built), the GPU tests; LEAN=1: l70 and q3 only
    # (no q14, no speculation drafts: nothing writes beside the phases that need neither)
    nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv > "$RES/gpu.txt"
    { lscpu | grep -iE "model name|^cpu\(s\)"; df -h /tmp /dev/shm; free -g; uname -r; } > "$RES/machine.txt"
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
    [ -f $TOK ] || { note "$TOK missing (bench/device_prep.sh makes it: synth takes its tokenizer from the default model)"; exit 1; }
    if [ "${MODELS:-1}" = 1 ] && [ ! -f /tmp/synth.rc ]; then
        setsid nohup bash -c "python3 -m hypura.cli.main synth llama3.3-70b $M70 --tokenizer-from $TOK --block-out-scale 0.000001 > /tmp/synth70.log 2>&1 &
            python3 -m hypura.cli.main synth qwen3-30b-a3b $MQ3 --tokenizer-from $TOK --block-out-scale 0.000001 > /tmp/synthq3.log 2>&1 &
            [ \"${LEAN:-0}\" = 1 ] || python3 -m hypura.cli.main synth qwen2.5-14b $M14 --tokenizer-from $TOK > /tmp/synth14.log 2>&1; wait
            echo done > /tmp/synth.rc; [ \"${LEAN:-0}\" = 1 ] || bash bench/h200.sh drafts > /tmp/synth-drafts.log 2>&1" \
            > /dev/null 2>&1 &
    fi
    start=$SECONDS
    if ls .prebuilt/lib-$KEY.tar.xz.part* > /dev/null 2>&1; then
        mkdir -p /tmp/prebuilt && cat .prebuilt/lib-$KEY.tar.xz.part* | tar xJf - -C /tmp/prebuilt || exit 1
        missing=$(LD_LIBRARY_PATH=/tmp/prebuilt ldd /tmp/prebuilt/*.so* /tmp/prebuilt/llama-* | grep "not found" | sort -u | paste -sd' ')
        if [ -n "$missing" ]; then
            note "prebuilt library $KEY: $missing; building"
        elif ! LD_LIBRARY_PATH=/tmp/prebuilt timeout 60 /tmp/prebuilt/llama-completion -m $TOK -p hi -n 4 -no-cnv -ngl 0 \
                < /dev/null > "$RES/prebuilt-smoke.txt" 2>&1; then  # built for another CPU: its instructions fault here
            note "prebuilt library $KEY fails on this CPU ($(tail -1 "$RES/prebuilt-smoke.txt")); building"
        else
            echo /tmp/prebuilt > /tmp/hypura-lib
            note "prebuilt library $KEY"
        fi
    fi
    if [ ! -f /tmp/hypura-lib ]; then
        lib=$(./build.sh lib 2> "$RES/build.log") || { tail -40 "$RES/build.log"; exit 1; }
        note "build: $((SECONDS - start)) s, lib: $lib"
        echo "$lib" > /tmp/hypura-lib
        (cd "$lib" && tar cf - --dereference ./*.so* llama-bench llama-completion llama-batched-bench llama-speculative-simple \
            ggml-rpc-server | xz -T16 -3) \
            | split -b 15M -d - "$OUT/lib-$KEY.tar.xz.part"
    fi
    export HYPURA_LIB_DIR=$(libdir) LD_LIBRARY_PATH=$(libdir)
    if [ "${GPUTESTS:-1}" = 1 ]; then
        # the GPU tests' MoE, where .device/ came without it (synth needs no library)
        [ -f .device/tiny-qwen3moe.gguf ] || hy synth tiny-qwen3moe .device/tiny-qwen3moe.gguf --tokenizer-from $TOK > /dev/null
        HYPURA_GPU_TESTS=1 HYPURA_GPU_TEST_MODEL=$PWD/.device/tiny-qwen3moe.gguf \
            HYPURA_GPU_TEST_DENSE=$PWD/$TOK PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 \
            timeout 120 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_gpu_placement.py > "$RES/pytest-gpu.txt" 2>&1
        tail -3 "$RES/pytest-gpu.txt"
    fi
    ;;
ab)  # the headline runs on this tree and on .oldtree, same library, same run: resident and dense streaming,
    # one sequence and the batched engine at 1 and 16 (the MoE paging run with AB_MOE=1)
    models_done
    "$(libdir)/llama-bench" -m $M14 -ngl 99 -p 512 -n 64 -r 3 -o json > "$RES/vanilla-q14-ngl99.json" 2> /dev/null
    note "q14 vanilla llama-bench -ngl 99 (pp512 tg64): $(tps "$RES/vanilla-q14-ngl99.json")"
    "$(libdir)/llama-bench" -m $M70 -ngl 14 -p 0 -n 8 -r 3 -o json > "$RES/vanilla-l70-ngl14.json" 2> /dev/null
    note "l70 vanilla llama-bench -ngl 14 tg8: $(tps "$RES/vanilla-l70-ngl14.json")"
    for side in new old; do
        # the old tree's bench sized its context as max(256, p + n + 64); the new side is given the same
        run=hy c14="-c 640" c="-c 256"; [ $side = old ] && run=old c14= c=
        [ $side = old ] && [ ! -d .oldtree ] && continue
        $run bench $M14 -p 512 -n 64 -r 3 $c14 --json "$RES/ab-$side-q14.json" 2>&1 | tail -2 | sed "s/^/q14 $side: /" | tee -a "$RES/summary.txt"
        $run bench $M14 --parallel 1,16 -p 128 -n 16 -r 2 --json "$RES/ab-$side-q14-par.json" 2>&1 | tail -4 \
            | sed "s/^/q14 par $side: /" | tee -a "$RES/summary.txt"
        $run bench $M70 --gpu-mem 8GiB --ram 64GiB -p 0 -n 8 -r 3 $c --json "$RES/ab-$side-l70.json" 2>&1 | tail -3 \
            | sed "s/^/l70 $side: /" | tee -a "$RES/summary.txt"
        $run bench $M70 --gpu-mem 8GiB --ram 64GiB --parallel 1,16 -p 128 -n 16 -r 2 --json "$RES/ab-$side-l70-par.json" \
            2>&1 | tail -4 | sed "s/^/l70 par $side: /" | tee -a "$RES/summary.txt"
        [ "${AB_MOE:-0}" = 1 ] || continue
        drop_cache
        $run bench $MQ3 --gpu-mem 4GiB --ram 8GiB -p 0 -n 16 -r 3 $c --json "$RES/ab-$side-q3.json" 2>&1 | tail -3 \
            | sed "s/^/q3 $side: /" | tee -a "$RES/summary.txt"
    done
    ;;
profile)  # the profile `hypura profile --force --model` measures (the same method as the first use's, which the
    # defaults phase ran), its time, and the predictions it gives at the A/B budgets (the CPU's rate is per model)
    cp "$(ls /tmp/xdg/hypura/profile*.json 2> /dev/null | head -1)" "$RES/profile-first-use.json" 2> /dev/null
    cp /tmp/xdg/hypura/cpu-*.json "$RES/" 2> /dev/null
    for m in $M70 $MQ3; do
        t0=$SECONDS
        timeout 300 python3 -m hypura.cli.main profile --force --json --model $m \
            > "$RES/profile-$(basename $m .gguf).json" 2> "$RES/profile-$(basename $m .gguf).err"
        note "profile --force --model $(basename $m): $((SECONDS - t0)) s, CPU $(grep -o '"decode_bw": [0-9.e+]*' "$RES/profile-$(basename $m .gguf).json")"
    done
    hy inspect $M70 --gpu-mem 8GiB --ram 64GiB -c 256 --json "$RES/plan-l70-g8.json" > /dev/null 2>&1
    hy inspect $MQ3 --gpu-mem 4GiB --ram 8GiB -c 256 --json "$RES/plan-q3-g4-r8.json" > /dev/null 2>&1
    note "predicted: l70 g8 $(grep -o '"tok_s": [0-9.]*' "$RES/plan-l70-g8.json" | head -1), q3 g4 r8 $(grep -o '"tok_s": [0-9.]*' "$RES/plan-q3-g4-r8.json" | head -1)"
    ;;
defaults)  # no placement flags, the GPU held by another process: vanilla's --fit beside Hypura's plan; first use
    # (a fresh $XDG_CACHE_HOME): the profile is measured on each model's own blocks; --stats: RSS peak beside budgets
    models_done
    args='-p "Once upon a time" -n 16 -no-cnv --temp 0'
    export XDG_CACHE_HOME=/tmp/xdg-first-use  # no profile yet, whatever ran before
    hold_gpu 8.5
    eval "\"$(libdir)/llama-completion\" -m $M70 $args" > "$RES/vanilla-l70-default.txt" 2>&1
    note "l70 vanilla default @8.5: $(grep -a 'eval time' "$RES/vanilla-l70-default.txt" | tail -1)"
    eval "hycli -m $M70 $args --stats" > "$RES/hypura-l70-default.txt" 2>&1
    note "l70 hypura default @8.5: $(grep -a 'hypura: plan\|eval time\|RSS peak' "$RES/hypura-l70-default.txt" | tail -3 | paste -sd' ')"
    hold_gpu 4.5
    eval "\"$(libdir)/llama-completion\" -m $MQ3 $args" > "$RES/vanilla-q3-default.txt" 2>&1
    note "q3 vanilla default @4.5: $(grep -a 'eval time' "$RES/vanilla-q3-default.txt" | tail -1)"
    eval "hycli -m $MQ3 $args --stats" > "$RES/hypura-q3-default.txt" 2>&1
    note "q3 hypura default @4.5: $(grep -a 'hypura: plan\|eval time\|RSS peak' "$RES/hypura-q3-default.txt" | tail -3 | paste -sd' ')"
    release_gpu
    ;;
loads)  # load time and time to first token (a one-token run, launch to exit) beside vanilla's, no placement flags:
    # first use (a fresh cache: the l70 measures the machine's profile; the q3 after it, only the CPU on its blocks),
    # then second runs with the file in the page cache and after the cache was dropped (bench/loads.sh)
    models_done
    rm -rf /tmp/xdg-loads; mkdir -p /tmp/xdg-loads
    hold_gpu 8.5
    FRESH=/tmp/xdg-loads LOGS=$RES/loads-l70 LIBDIR=$(libdir) timeout 200 bash bench/loads.sh $M70 2>&1 | tee -a "$RES/summary.txt"
    hold_gpu 4.5
    FRESH=/tmp/xdg-loads LOGS=$RES/loads-q3 LIBDIR=$(libdir) timeout 120 bash bench/loads.sh $MQ3 2>&1 | tee -a "$RES/summary.txt"
    release_gpu
    ;;
cgroup)  # the 70B larger than RAM too: a 24 GiB memory cgroup (page cache counted), cache dropped, GPU at 8.5 GiB
    models_done
    cg=$(memory_cgroup $((24 * GIB))) || { note "no memory cgroup here"; return 0; }
    hold_gpu 8.5
    drop_cache
    in_cgroup $cg timeout 150 python3 -m hypura.cli.completion -m $M70 -p "'Once upon a time'" -n 4 -no-cnv --temp 0 \
        > "$RES/hypura-l70-cgroup.txt" 2>&1
    note "l70 hypura cgroup 24G: $(grep -a 'hypura:\|eval time' "$RES/hypura-l70-cgroup.txt" | tail -3 | paste -sd' ')"
    drop_cache
    in_cgroup $cg timeout 120 python3 -m hypura.cli.main bench $M70 -p 0 -n 2 -r 1 --json "$RES/hypura-l70-cgroup-bench.json" \
        > "$RES/hypura-l70-cgroup-bench.txt" 2>&1
    note "l70 hypura bench cgroup 24G: $(tail -3 "$RES/hypura-l70-cgroup-bench.txt" | paste -sd' ')"
    drop_cache
    in_cgroup $cg timeout 100 "$(libdir)/llama-completion" -m $M70 -p "'Once upon a time'" -n 2 -no-cnv --temp 0 \
        > "$RES/vanilla-l70-cgroup.txt" 2>&1
    note "l70 vanilla cgroup 24G (rc $?): $(grep -a 'eval time' "$RES/vanilla-l70-cgroup.txt" | tail -1)"
    release_gpu
    ;;
batched-l70|batched-q14|batched-q3)  # aggregate decode and prefill at 1/4/16/32 sequences beside llama-batched-bench
    models_done
    bb() { "$(libdir)/llama-batched-bench" -m "$1" -c 8192 -npp 128 -ntg 16 -npl "$2" "${@:3}" 2>&1 \
        | grep -E '^\|' > "$RES/vanilla-batched-$(basename "$1" .gguf).txt"; cat "$RES/vanilla-batched-$(basename "$1" .gguf).txt"; }
    case "$1" in
    batched-l70)
        bb $M70 1,4,16,32 -ngl 14
        hy bench $M70 --gpu-mem 8GiB --ram 64GiB --parallel 1,4,16,32 -p 128 -n 16 -r 1 --json "$RES/hypura-batched-l70.json" \
            2>&1 | tail -8 | tee -a "$RES/summary.txt" ;;
    batched-q14)
        bb $M14 1,4,16,32 -ngl 99
        hy bench $M14 --parallel 1,4,16,32 -p 128 -n 16 -r 1 --json "$RES/hypura-batched-q14.json" 2>&1 | tail -8 \
            | tee -a "$RES/summary.txt" ;;
    batched-q3)
        bb $MQ3 1,4,16,32 -ngl 99 -ncmoe 41
        hy bench $MQ3 --gpu-mem 4GiB --parallel 1,4,16,32 -p 128 -n 16 -r 1 --json "$RES/hypura-batched-q3.json" \
            2>&1 | tail -8 | tee -a "$RES/summary.txt" ;;
    esac
    ;;
perstep)  # one load, every step at its path: the engine's plan for 32 sequences at 1/4/16/32
    models_done
    hy bench $M70 --gpu-mem 8GiB --ram 64GiB --parallel 1,4,16,32 -p 128 -n 16 -r 1 --json "$RES/hypura-perstep-l70.json" \
        2>&1 | tail -8 | tee -a "$RES/summary.txt"
    ;;
prefill)  # prompts at the link's bound: q3 at 4 GiB and l70 at 8 GiB, one prompt of 512 / 2048 (/ 8192) tokens and
    # 128-token prompts of 1 / 4 / 16 / 32 sequences, beside vanilla; the plans Hypura chose (micro-batch, pinned
    # CPU weights) from `inspect`. Pairs first (Hypura, then vanilla's best for the same rows), extras after.
    models_done
    hy inspect $MQ3 --gpu-mem 4GiB --ram 64GiB --json "$RES/plan-q3-g4.json" 2>&1 | grep -E "context|mode|chosen|predict" \
        | sed "s/^/q3 plan: /" | tee -a "$RES/summary.txt"
    timeout 200 python3 -m hypura.cli.main bench $MQ3 --gpu-mem 4GiB --ram 64GiB -p 512,2048 -n 32 -r 2 \
        --json "$RES/hypura-q3-pp.json" 2>&1 | tail -6 | sed "s/^/q3 hypura: /" | tee -a "$RES/summary.txt"
    # the plan for 16 sequences (a server's): its steps stream whole expert stacks into GPU slots from some size on,
    # copies overlapping the compute where op offload's wait for it
    hy inspect $MQ3 --gpu-mem 4GiB --ram 64GiB -np 16 --json "$RES/plan-q3-g4-np16.json" 2>&1 \
        | grep -E "context|mode|chosen|predict|experts streamed" | sed "s/^/q3 plan -np 16: /" | tee -a "$RES/summary.txt"
    timeout 150 python3 -m hypura.cli.main bench $MQ3 --plan "$RES/plan-q3-g4-np16.json" -p 512,2048 -n 0 -r 2 \
        --json "$RES/hypura-q3-pp-np16plan.json" 2>&1 | tail -5 | sed "s/^/q3 hypura, -np 16 plan: /" | tee -a "$RES/summary.txt"
    # the same plan from the design profile (no batch gain, the default GPU rate): every all-RAM layer's stacks
    # streamed at a prompt's step, whatever the measured rates chose above
    hy inspect $MQ3 --profile h200-design --gpu-mem 4GiB --ram 64GiB -np 16 --json "$RES/plan-q3-g4-np16-design.json" 2>&1 \
        | grep -E "chosen|predict|experts streamed" | sed "s/^/q3 design plan -np 16: /" | tee -a "$RES/summary.txt"
    timeout 100 python3 -m hypura.cli.main bench $MQ3 --plan "$RES/plan-q3-g4-np16-design.json" -p 512,2048 -n 0 -r 2 \
        --json "$RES/hypura-q3-pp-np16design.json" 2>&1 | tail -5 | sed "s/^/q3 hypura, design -np 16 plan: /" \
        | tee -a "$RES/summary.txt"
    # vanilla -lm none (pinned host weights, its best for prompts: 3-5x mmap's, 2026-12-06) at micro-batches 512 to
    # 4096 (FULL=1: mmap's one-prompt and decode rows too)
    for cfg in $([ "${FULL:-0}" = 1 ] && echo mmap) lmnone; do
        lm=""; ub=512; [ $cfg = mmap ] || { lm="-lm none"; ub=512,2048,4096; }
        timeout 150 "$(libdir)/llama-bench" -m $MQ3 -ngl 99 -ncmoe 41 $lm -ub $ub -p 512,2048 -n 32 -r 2 -o json \
            > "$RES/vanilla-q3-pp-$cfg.json" 2> /dev/null
        note "q3 vanilla -ncmoe 41 $lm -ub $ub pp512 pp2048 tg32 (each -ub): $(tps "$RES/vanilla-q3-pp-$cfg.json")"
    done
    if [ "${L70:-1}" = 1 ]; then  # L70=0: the MoE's rows only
    hy inspect $M70 --gpu-mem 8GiB --ram 64GiB --json "$RES/plan-l70-g8.json" 2>&1 | grep -E "context|mode|chosen|predict" \
        | sed "s/^/l70 plan: /" | tee -a "$RES/summary.txt"
    timeout 240 python3 -m hypura.cli.main bench $M70 --gpu-mem 8GiB --ram 64GiB -p 512,2048,8192 -n 0 -r 1 \
        --json "$RES/hypura-l70-pp.json" 2>&1 | tail -6 | sed "s/^/l70 hypura: /" | tee -a "$RES/summary.txt"
    timeout 200 "$(libdir)/llama-bench" -m $M70 -ngl 14 -lm none -ub 512,2048 -p 512,2048,8192 -n 0 -r 1 -o json \
        > "$RES/vanilla-l70-pp-lmnone.json" 2> /dev/null
    note "l70 vanilla -ngl 14 -lm none -ub 512,2048 pp512 pp2048 pp8192 (each -ub): $(tps "$RES/vanilla-l70-pp-lmnone.json")"
    fi
    # the GPU's own compute for the same prompts, every weight resident (q3 fits the whole GPU): what a micro-batch
    # costs beside its copies (op offload's copies and compute run one after the other)
    release_gpu; timeout 100 "$(libdir)/llama-bench" -m $MQ3 -ngl 99 -ub 2048 -p 512,2048 -n 0 -r 2 -o json \
        > "$RES/vanilla-q3-pp-resident.json" 2> /dev/null
    note "q3 vanilla resident -ngl 99 -ub 2048 pp512 pp2048: $(tps "$RES/vanilla-q3-pp-resident.json")"
    timeout 200 python3 -m hypura.cli.main bench $MQ3 --plan "$RES/plan-q3-g4-np16.json" --parallel 1,4,16,32 -p 128 \
        -n 16 -r 1 --json "$RES/hypura-batched-q3-np16plan.json" 2>&1 | tail -7 \
        | sed "s/^/q3 hypura batched, -np 16 plan: /" | tee -a "$RES/summary.txt"
    timeout 150 "$(libdir)/llama-batched-bench" -m $MQ3 -c 8192 -npp 128 -ntg 16 -npl 1,4,16,32 -ngl 99 -ncmoe 41 -lm none \
        2>&1 | grep -E '^\|' > "$RES/vanilla-batched-q3-lmnone.txt"
    sed "s/^/q3 vanilla batched lmnone: /" "$RES/vanilla-batched-q3-lmnone.txt" | tee -a "$RES/summary.txt"
    [ "${FULL:-0}" = 1 ] && timeout 200 python3 -m hypura.cli.main bench $MQ3 --gpu-mem 4GiB --ram 64GiB \
        --parallel 1,4,16,32 -p 128 -n 16 -r 1 --json "$RES/hypura-batched-q3.json" 2>&1 | tail -7 \
        | sed "s/^/q3 hypura batched: /" | tee -a "$RES/summary.txt"
    ;;
vanilla-best)  # vanilla's best at each size: mmap (its default), and -lm none with GGML_OP_OFFLOAD_MIN_BATCH=4 (pinned
    # host weights, op offload from 4 tokens; at 1 token it is -lm none, at 32 the default min batch's)
    models_done
    for cfg in mmap lmnone-mb4; do
        lm=""; mb=32; [ $cfg = mmap ] || { lm="-lm none"; mb=4; }
        GGML_OP_OFFLOAD_MIN_BATCH=$mb timeout 300 "$(libdir)/llama-batched-bench" -m $M70 -c 8192 -npp 128 -ntg 16 \
            -npl 1,4,16,32 -ngl 14 $lm 2>&1 | grep -E '^\|' > "$RES/vanilla-batched-l70-$cfg.txt"
        sed "s/^/vanilla $cfg: /" "$RES/vanilla-batched-l70-$cfg.txt" | tee -a "$RES/summary.txt"
    done
    ;;
passes)  # a pass's cost by its tokens (the verification curve) beside llama-bench's, one load each
    models_done
    for lm in "" "-lm none"; do
        "$(libdir)/llama-bench" -m $M70 -ngl 14 $lm -p 1,2,4,8,16,32,64 -n 0 -r 2 -o json \
            > "$RES/vanilla-passes-l70${lm:+-lmnone}.json" 2> /dev/null
        note "l70 vanilla llama-bench -ngl 14 $lm -p 1..64: $(tps "$RES/vanilla-passes-l70${lm:+-lmnone}.json")"
    done
    hy bench $M70 --gpu-mem 8GiB --ram 64GiB -p 1,2,4,8,16,32,64 -n 0 -r 2 --json "$RES/hypura-passes-l70.json" 2>&1 \
        | tail -9 | tee -a "$RES/summary.txt"
    ;;
ttft)  # time to first token of one 4,096-token prompt through `hypura serve` beside vanilla llama-server of the same
    # source (built on the CPU side against the same headers: .prebuilt/llama-server.tar.xz; it runs on this build's
    # libraries), with vanilla's best flags for prompts (-lm none: pinned host weights, micro-batch 2048)
    models_done
    srv=/tmp/llama-server; mkdir -p $srv && tar xJf .prebuilt/llama-server.tar.xz -C $srv || exit 1
    for m in q3 l70; do
        case $m in
            q3) M=$MQ3 gpu=4GiB vflags="-ngl 99 -ncmoe 41 -lm none" reps=3 ;;
            l70) M=$M70 gpu=8GiB vflags="-ngl 14 -lm none" reps=2 ;;
        esac
        timeout 240 python3 bench/serve_ttft.py $M --port 8091 --repeats $reps --json "$RES/ttft-$m-hypura.json" -- \
            python3 -m hypura.cli.main serve -m $M --port 8091 -np 1 -c 8192 --gpu-mem $gpu --ram 64GiB \
            2>&1 | tail -1 | sed "s/^/$m hypura serve: /" | tee -a "$RES/summary.txt"
        for ub in 2048; do  # its best for these prompts (ub 512: 2.6 s for the MoE, 2026-12-06)
            LD_LIBRARY_PATH=$srv:$(libdir) timeout 200 python3 bench/serve_ttft.py $M --port 8092 --repeats $reps \
                --json "$RES/ttft-$m-vanilla-ub$ub.json" -- $srv/llama-server -m $M --port 8092 -np 1 -c 8192 $vflags \
                -ub $ub -b $ub 2>&1 | tail -1 | sed "s/^/$m llama-server $vflags -ub $ub: /" | tee -a "$RES/summary.txt"
        done
    done
    ;;
pins)  # what pinned host memory costs here: allocation, fills, registering the page cache's pages (bench/pin_probe.py)
    models_done
    timeout 120 python3 bench/pin_probe.py $MQ3 --gib 8 --json "$RES/pin-probe.json" 2>&1 | sed "s/^/pins: /" \
        | tee -a "$RES/summary.txt"
    ;;
serve-np16)  # one and sixteen clients through `hypura serve -np 16` beside hypura-cli's one sequence (`hypura bench`)
    models_done  # and beside `hypura bench --parallel 16` of the same load (16-token prompts, 16 tokens each)
    hy bench $M70 --gpu-mem 8GiB --ram 64GiB -p 0 -n 16 -r 2 --json "$RES/hypura-single-l70.json" 2>&1 | tail -2 \
        | sed "s/^/l70 one sequence: /" | tee -a "$RES/summary.txt"
    hy bench $M70 --gpu-mem 8GiB --ram 64GiB --parallel 16 -p 16 -n 16 -r 2 --json "$RES/hypura-par16-l70.json" 2>&1 \
        | tail -3 | sed "s/^/l70 --parallel 16: /" | tee -a "$RES/summary.txt"
    for c in ${CLIENTS:-1 16}; do
        timeout 300 python3 bench/serve_throughput.py $M70 --clients $c --parallel 16 --tokens 16 --gpu-mem 8GiB \
            --ram 64GiB --json "$RES/serve-np16-l70-c$c.json" > "$RES/serve-np16-l70-c$c.txt" 2>&1
        grep -E '^\| (engine|hypura)|served / engine|Error|error' "$RES/serve-np16-l70-c$c.txt" \
            | sed "s/^/serve -np 16, $c clients: /" | tee -a "$RES/summary.txt"
    done
    ;;
serve)  # the same through `hypura serve`: 16 concurrent openai clients beside the engine alone
    models_done
    timeout 400 python3 bench/serve_throughput.py $M70 --clients 16 --parallel 16 --tokens 16 --gpu-mem 8GiB --ram 64GiB \
        > "$RES/serve-l70.txt" 2>&1
    tail -6 "$RES/serve-l70.txt" | tee -a "$RES/summary.txt"
    ;;
store)  # models by name: an Ollama store of the 70B and the MoE served with no flags; first requests and switches
    models_done
    rm -rf /tmp/ollama-store
    timeout 280 python3 -m bench.store_switch /tmp/ollama-store --make llama3.3:70b=$M70 --make qwen3:30b-a3b=$MQ3 \
        --tokens 32 -t 16 --json "$RES/store-switch.json" > "$RES/store-switch.txt" 2>&1
    tail -15 "$RES/store-switch.txt" | tee -a "$RES/summary.txt"
    HYPURA_FREE_MEMORY=gpu=48GiB timeout 280 python3 -m bench.store_switch /tmp/ollama-store --tokens 32 -t 16 \
        --json "$RES/store-switch-48g.json" > "$RES/store-switch-48g.txt" 2>&1
    tail -15 "$RES/store-switch-48g.txt" | tee -a "$RES/summary.txt"
    ;;
drafts)  # the synthetic drafts spec needs (setup's background job runs this after the models; else spec does)
    models_done
    echo started > /tmp/drafts.started
    for a in 0.6 0.8 0.9; do
        [ -f "$(draft70 $a)" ] || hy synth --draft-for $M70 "$(draft70 $a)" --agreement $a --layers 2 > "$RES/synth-draft-$a.log" 2>&1 &
    done
    [ -f "$(draftq3)" ] || hy synth --draft-for $MQ3 "$(draftq3)" --agreement 0.8 --layers 2 > "$RES/synth-draft-q3.log" 2>&1
    wait
    echo done > /tmp/drafts.rc
    ;;
spec)  # speculative decoding in one phase (~6 min): l70 at 8 GiB with the synthetic drafts at 0.6 / 0.8 / 0.9, chains
    # and trees, one load; vanilla's plain decode and llama-speculative-simple with the same pairs (mmap; -lm none at
    # 0.8); q3 at 4 GiB at 0.8 the same. The drafts are made by setup's background job (drafts_done).
    drafts_done
    n=${SPEC_TOKENS:-32} agreements=${AGREEMENTS:-0.6 0.8 0.9}  # 32 tokens: vanilla decodes 1.2 tok/s with its draft
    sp() { local name=$1 limit=$2; shift 2
        timeout "$limit" python3 bench/spec.py "$@" --tokens "$n" --n-max 16 --threads 16 --vanilla-timeout 100 \
            --json "$RES/spec-$name.json" > "$RES/spec-$name.txt" 2>&1 || note "spec $name: rc $?"
        sed -n '/^summary$/,$p' "$RES/spec-$name.txt" | grep '^prompt ' | sed "s/^prompt    /spec $name /" \
            | tee -a "$RES/summary.txt"; }
    sp l70-hypura 240 $M70 $(for a in $agreements; do echo --draft $(draft70 $a); done) --tree 0,4 \
        --gpu-mem 8GiB --ram 64GiB --no-vanilla
    sp l70-vanilla-0.8 200 $M70 --draft "$(draft70 0.8)" --no-hypura --vanilla-spec-args "-ngl 14 -ngld 99" \
        --vanilla-spec-args "-ngl 14 -ngld 99 -lm none" --vanilla-bench-args "-ngl 14"
    others=$(for a in $agreements; do [ $a = 0.8 ] || echo --draft $(draft70 $a); done)
    [ -z "$others" ] || sp l70-vanilla 150 $M70 $others --no-hypura --vanilla-spec-args "-ngl 14 -ngld 99"
    sp q3 150 $MQ3 --draft "$(draftq3)" --tree 0,4 --gpu-mem 4GiB --vanilla-spec-args "-ngl 99 -ncmoe 41 -ngld 99" \
        --vanilla-bench-args "-ngl 99 -ncmoe 41"
    ;;
spec-serve)  # hypura serve with no speculation flags (auto: the 0.8 draft found in a store beside the 70B) for 1 and
    # 16 clients, beside --spec-type none (~4 min): the one client gains, sixteen lose nothing (the engine steps aside)
    drafts_done
    mkdir -p /dev/shm/spec-store && ln -sf "$(draft70 0.8)" /dev/shm/spec-store/l70-draft.gguf
    for c in 1 16; do
        for sp in auto none; do
            timeout 200 python3 bench/serve_throughput.py $M70 --clients $c --parallel 16 --tokens 32 --gpu-mem 8GiB \
                --ram 64GiB --threads 16 --spec $sp --models-dir /dev/shm/spec-store --served-only \
                --json "$RES/spec-serve-c$c-$sp.json" > "$RES/spec-serve-c$c-$sp.txt" 2>&1 || note "spec-serve $c $sp: rc $?"
            grep -a "^| hypura serve\|^speculative:\|hypura: draft" "$RES/spec-serve-c$c-$sp.txt" \
                | sed "s/^/spec-serve $c clients, $sp: /" | tee -a "$RES/summary.txt"
        done
    done
    ;;
smoke)  # the MoE alone, once its model is written: the plan, a 2048-token prompt and decode, beside vanilla mmap and
    # -lm none; then the same plan with CPU weights forced pinned and forced as llama.cpp holds them (the measured
    # profile with the unrepacked rate set to the repacked one's, and to half of it): what pinning costs decode
    while ! grep -q wrote /tmp/synthq3.log 2> /dev/null; do sleep 5; done
    for cfg in mmap lmnone; do
        lm=""; [ $cfg = mmap ] || lm="-lm none"
        timeout 90 "$(libdir)/llama-bench" -m $MQ3 -ngl 99 -ncmoe 41 $lm -p 2048 -n 32 -r 1 -o json \
            > "$RES/smoke-vanilla-q3-$cfg.json" 2> /dev/null
        note "q3 vanilla -ncmoe 41 $lm pp2048 tg32: $(tps "$RES/smoke-vanilla-q3-$cfg.json")"
    done
    hy inspect $MQ3 --gpu-mem 4GiB --ram 64GiB 2>&1 | grep -E "context|mode|chosen|predict|prompts" | sed "s/^/q3 plan: /" \
        | tee -a "$RES/summary.txt"
    hy profile --json --model $MQ3 > "$RES/profile.json" 2> /dev/null  # the cached one, the CPU on this model's blocks
    grep -o '"decode_bw[_a-z]*": [0-9.e+]*' "$RES/profile.json" | paste -sd' ' | sed "s/^/profile: /" | tee -a "$RES/summary.txt"
    for share in 1.0 0.5; do
        python3 -c "import json,sys; p=json.load(open('$RES/profile.json')); c=p['cpu']; c['decode_bw_plain']=c['decode_bw']*$share
json.dump(p, open('/tmp/profile-$share.json','w'))"
        timeout 150 python3 -m hypura.cli.main bench $MQ3 --gpu-mem 4GiB --ram 64GiB -p 2048 -n 32 -r 1 \
            --profile /tmp/profile-$share.json --json "$RES/smoke-q3-$share.json" 2>&1 | grep -E "plan|pp|tg|prefill|decode" \
            | tail -6 | sed "s/^/q3 hypura plain-share $share: /" | tee -a "$RES/summary.txt"
    done
    ;;
rpc-gpu)  # the GPU plus a loopback ggml-rpc-server on the same GPU: the RPC link's cost against the split's bound
    # (the 14B held to 5 GiB here, the rest over RPC), beside vanilla with the same split; under 3 minutes
    models_done
    port=50152
    "$(libdir)/ggml-rpc-server" -H 127.0.0.1 -p $port -d CUDA0 -t 4 > "$RES/rpc-server.log" 2>&1 &
    echo $! > /tmp/rpc.pid
    for _ in $(seq 30); do (exec 3<> /dev/tcp/127.0.0.1/$port) 2> /dev/null && break; sleep 1; done
    timeout 60 python3 -m hypura.cli.main inspect $M14 --rpc 127.0.0.1:$port --gpu-mem 5GiB -c 4096 2>&1 | tee "$RES/rpc-gpu-inspect.txt" \
        | tail -6 | tee -a "$RES/summary.txt"
    timeout 90 python3 -m hypura.cli.main bench $M14 --rpc 127.0.0.1:$port --gpu-mem 5GiB -p 64 -n 64 -r 2 --json "$RES/rpc-gpu.json" \
        2>&1 | tail -6 | tee -a "$RES/summary.txt"
    flags=$(python3 -c "import json; print(json.load(open('$RES/rpc-gpu.json'))['split']['flags'])" 2> /dev/null)
    [ -n "$flags" ] && timeout 60 "$(libdir)/llama-completion" -m $M14 --rpc 127.0.0.1:$port $flags -c 4096 -p hi \
        -n 64 -no-cnv --temp 0 < /dev/null 2>&1 | grep -E "eval time|error" | sed 's/^/rpc-gpu vanilla: /' \
        | tee -a "$RES/summary.txt"
    kill "$(cat /tmp/rpc.pid)" 2> /dev/null
    ;;
split-gpus)  # several GPUs (an x2/x4 kind): the 70B split over them by Hypura (--split) beside vanilla's -sm layer, and
    # the batched engine at 1 / 16 / 32 sequences over both; under 5 minutes
    models_done
    timeout 60 python3 -m hypura.cli.main inspect $M70 --split -c 4096 2>&1 | tail -8 | tee "$RES/split-gpus-inspect.txt" | tee -a "$RES/summary.txt"
    timeout 150 "$(libdir)/llama-bench" -m $M70 -ngl 99 -sm layer -p 512 -n 32 -r 2 -o json > "$RES/vanilla-l70-smlayer.json" \
        2> /dev/null
    note "l70 vanilla -sm layer pp512 tg32: $(tps "$RES/vanilla-l70-smlayer.json")"
    timeout 150 python3 -m hypura.cli.main bench $M70 --split -p 512 -n 32 -r 2 --json "$RES/split-gpus-l70.json" 2>&1 | tail -6 \
        | tee -a "$RES/summary.txt"
    timeout 150 python3 -m hypura.cli.main bench $M70 --split --parallel 1,16,32 -p 128 -n 16 -r 1 --json "$RES/split-gpus-l70-batched.json" \
        2>&1 | tail -8 | tee -a "$RES/summary.txt"
    ;;
bigmoe)  # the largest MoE shapes by layer subsets (docs/large-moe.md): for each target machine (a 24 GB GPU with
    # 64 GiB RAM, an H100 with 128 GiB), each subset's budgets keep the full model's tier shares (bench/extrapolate.py
    # budgets), runs interleaved in rounds, vanilla's -ncmoe beside; then the full depth extrapolated. SHAPES= to pick
    # (default qwen3-235b-a22b deepseek-v3); subsets: 2 and 4 MoE blocks (deepseek-v3: after its 3 dense ones)
    for shape in ${SHAPES:-qwen3-235b-a22b deepseek-v3}; do
        lead=0; [ $shape = deepseek-v3 ] && lead=3
        hy synth $shape /tmp/$shape-full.gguf --sparse > /dev/null
        for n in 2 4; do
            [ -f /tmp/$shape-L$n.gguf ] || hy synth $shape /tmp/$shape-L$n.gguf --layers $((lead + n)) --tokenizer-from $TOK \
                --block-out-scale 0.000001 > /dev/null 2>&1
        done
        for target in 24gb-gpu-64gb:22GiB:58GiB h100-128gb:76GiB:120GiB; do
            IFS=: read -r prof gpu ram <<< "$target"
            hy inspect /tmp/$shape-full.gguf --profile $prof --gpu-mem $gpu --ram $ram -c 4096 \
                --json "$RES/bigmoe-$shape-$prof-plan.json" | grep -E "^(mode|predict|hits|bound)" \
                | sed "s/^/$shape on $prof full plan: /" | tee -a "$RES/summary.txt"
            for n in 2 4; do
                python3 -m bench.extrapolate budgets /tmp/$shape-full.gguf /tmp/$shape-L$n.gguf --profile $prof \
                    --gpu-mem $gpu --ram $ram -c 4096 --json "$RES/bigmoe-$shape-$prof-L$n-budgets.json" > /dev/null
            done
            for round in 1 2 3; do
                for n in 2 4; do
                    b="$RES/bigmoe-$shape-$prof-L$n-budgets.json"
                    sg=$(python3 -c "import json; print(json.load(open('$b'))['subset']['gpu_mem'] >> 20)")
                    sr=$(python3 -c "import json; print(json.load(open('$b'))['subset']['ram'] >> 20)")
                    drop_cache
                    timeout 300 python3 -m hypura.cli.main bench /tmp/$shape-L$n.gguf --profile $prof --gpu-mem ${sg}MiB --ram ${sr}MiB \
                        -c 4096 -p 512 -n 32 -r 1 --json "$RES/bigmoe-$shape-$prof-L$n-r$round.json" > /dev/null 2>&1
                done
            done
            python3 -m bench.extrapolate predict "$RES"/bigmoe-$shape-$prof-L*-r*.json --full /tmp/$shape-full.gguf \
                --json "$RES/bigmoe-$shape-$prof-predict.json" | grep -E '"(predicted|fixed)' | paste -sd' ' \
                | sed "s/^/$shape on $prof extrapolated: /" | tee -a "$RES/summary.txt"
        done
        for n in 2 4; do  # vanilla's placement that fits any of them: every block's experts in RAM (mmap)
            timeout 300 "$(libdir)/llama-bench" -m /tmp/$shape-L$n.gguf -ngl 99 -ncmoe $((lead + n)) -p 512 -n 32 -r 3 -o json \
                > "$RES/bigmoe-vanilla-$shape-L$n.json" 2> /dev/null
            note "$shape L$n vanilla -ncmoe all pp512 tg32: $(tps "$RES/bigmoe-vanilla-$shape-L$n.json")"
        done
        rm -f /tmp/$shape-L*.gguf
    done
    ;;
pack)
    cp /tmp/synth*.log "$RES/" 2> /dev/null
    tar czf "$OUT/results.tgz" -C "$RES" .
    ;;
*) echo "unknown phase $1"; exit 2 ;;
esac
}

for p in "$@"; do
    echo "== $p $(date +%T)" | tee -a "$RES/summary.txt"
    phase "$p"
    cp "$RES/summary.txt" "$OUT/summary.txt"  # back even when a later phase outlasts the call
done
