#!/usr/bin/env bash
# Evidence on the lent H200 (issues #4 and #5). One device call runs several phases:
#   bash bench/h200_tier_runtime.sh setup vanilla70 auto zero disk ...    (then `pack`, last)
#   phases: setup | profile | zero | contention | queueing | numerics | diskreq | burst | faultin | vanilla70 | plans | auto | pinnedab | disk | synthmoe | synthmix | moe | moeplan | moerecord | moewarm | vanillaram | pack
# carry [".anchors", ".whl", ".device", ".prebuilt"]. One build serves both sides: our patched
# library with no hooks installed is llama.cpp itself (the hooks only act when Hypura installs them).
# A CUDA build costs ~5 minutes of a 30-minute device budget, so `setup` packs the built library
# into $OUT (lib-<patch hash>.tar.xz.partNN); copied into .prebuilt/, a later call skips the build.
# $OUT takes 8 files: results gather in $RES and `pack` archives them as one.
# The carried folders are not committed: bench/device_prep.sh makes them on a bare checkout.
set -uo pipefail
OUT=${OUT:-/tmp/out}; RES=/tmp/res; mkdir -p "$OUT" "$RES"
export HYPURA_LLAMA_SRC=$PWD/.anchors/llamacpp-src.tar.xz HYPURA_BACKEND=cuda CUDA_ARCHS=90
export HYPURA_CACHE=/tmp/hypura-cache HYPURA_BUILD_TARGETS="llama llama-bench"
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:${HYPURA_TREE:-$PWD}  # HYPURA_TREE: another copy of hypura/, to A/B
M70=/tmp/l70.gguf M14=/tmp/q14.gguf PROFILE=${PROFILE:-bench/results/h200-profile-2026-12-02.json} T=${T:-16}
TOK=.device/tiny-llama.gguf
KEY=$(cat patches/*.patch | sha256sum | cut -c1-12)
hy() { python3 -m hypura.cli.main "$@"; }
libdir() { cat /tmp/hypura-lib; }
threads() { [ "$T" = 0 ] || echo "-t $T"; }  # T=0: Hypura's default thread count
synth_done() { while [ ! -f /tmp/synth.rc ]; do sleep 5; done; }
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
SYNTH14=${SYNTH14:-1} SYNTH70=${SYNTH70:-1}  # 0: skip that model (disk space, time)

phase() {
[ -f /tmp/hypura-lib ] && export HYPURA_LIB_DIR=$(libdir) LD_LIBRARY_PATH=$(libdir)  # a prebuilt one's RPATH is gone
case "$1" in
setup)  # wheels, models (background), the library (prebuilt or built), GPU tests
    nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv > "$RES/gpu.txt"
    { lscpu | grep -iE "numa|model name|^cpu\(s\)"; df -h /tmp; free -g; uname -r
      echo "THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled)"; } > "$RES/machine.txt"
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
    setsid nohup bash -c "[ $SYNTH70 = 1 ] && python3 -m hypura.cli.main synth llama3.3-70b $M70 --tokenizer-from $TOK > /tmp/synth70.log 2>&1;
        [ $SYNTH14 = 1 ] && python3 -m hypura.cli.main synth qwen2.5-14b $M14 --tokenizer-from $TOK > /tmp/synth14.log 2>&1; echo done > /tmp/synth.rc" \
        > /dev/null 2>&1 &
    start=$SECONDS
    if ls .prebuilt/lib-$KEY.tar.xz.part* > /dev/null 2>&1; then
        mkdir -p /tmp/prebuilt && cat .prebuilt/lib-$KEY.tar.xz.part* | tar xJf - -C /tmp/prebuilt || exit 1
        echo /tmp/prebuilt > /tmp/hypura-lib
        echo "prebuilt library $KEY" | tee -a "$RES/summary.txt"
    else
        lib=$(./build.sh lib 2> "$RES/build.log") || { tail -40 "$RES/build.log"; exit 1; }
        echo "build: $((SECONDS - start)) s, lib: $lib" | tee -a "$RES/summary.txt"
        echo "$lib" > /tmp/hypura-lib
        (cd "$lib" && tar cf - --dereference ./*.so* llama-bench | xz -T16 -3) | split -b 15M -d - "$OUT/lib-$KEY.tar.xz.part"
    fi
    export HYPURA_LIB_DIR=$(libdir) LD_LIBRARY_PATH=$(libdir)
    HYPURA_GPU_TESTS=1 HYPURA_GPU_TEST_MODEL=$PWD/.device/tiny-qwen3moe.gguf \
        HYPURA_GPU_TEST_DENSE=$PWD/$TOK PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 \
        python3 -m pytest -v -rA -p no:cacheprovider tests/test_gpu_placement.py > "$RES/pytest-gpu.txt" 2>&1
    tail -3 "$RES/pytest-gpu.txt"
    ;;
zero)  # everything resident: llama-bench (same build, hooks off) vs hypura bench
    synth_done
    "$(libdir)/llama-bench" -m $M14 -ngl 99 -p 512 -n 128 -r 3 -o json > "$RES/vanilla-q14-ngl99.json" 2> /dev/null
    grep -o '"avg_ts": [0-9.]*' "$RES/vanilla-q14-ngl99.json"
    hy bench $M14 -p 512 -n 128 -r 3 -t $T --json "$RES/hypura-q14-resident.json" 2>&1 | tail -3
    ;;
contention)  # do pinned host->GPU copies slow the CPU's decode?
    synth_done
    python3 bench/ram_contention.py "$(libdir)/llama-bench" $M70 "$RES/ram-contention.json" | tail -12
    ;;
vanilla70)  # (a)'s baseline: llama.cpp's best partial offload within 8 GiB
    synth_done
    "$(libdir)/llama-bench" -m $M70 -ngl 14 -t $T -p 0 -n ${NGEN:-16} -r 3 -o json > "$RES/vanilla-l70-ngl14.json" 2> /dev/null
    grep -o '"avg_ts": [0-9.]*' "$RES/vanilla-l70-ngl14.json"
    ;;
plans)  # (a) with plan files: PLANS="bench/plans/x.json ..."
    synth_done
    for p in ${PLANS:?}; do
        echo "== $p"
        hy bench $M70 --plan "$p" -p 0 -n ${NGEN:-16} -r ${REPS:-2} -t $T \
            --json "$RES/hypura-l70-$(basename "$p")" 2>&1 | tail -3
    done
    ;;
auto)  # (a) with the plan the planner makes from the budgets
    synth_done
    hy bench $M70 --gpu-mem 8GiB --ram 64GiB -p 0 -n ${NGEN:-16} -r ${REPS:-3} -t $T --profile $PROFILE \
        --json "$RES/hypura-l70-g8-r64-planner${TAG:-}.json" 2>&1 | tail -5
    ;;
pinnedab)  # (a)'s "before": the CPU's compute buffer pinned (queued behind weight copies), same plan
    synth_done
    python3 bench/pinned_compute_ab.py $M70 --gpu-mem 8GiB --ram 64GiB -p 0 -n ${NGEN:-16} -r ${REPS:-3} -t $T \
        --profile $PROFILE --json "$RES/hypura-l70-g8-r64-planner-pinned${TAG:-}.json" 2>&1 | tail -5
    ;;
moe)  # #5: an MoE model (MOE=path): vanilla with the experts in RAM (all; all but 7 layers' on the GPU,
       # 4 GiB) beside Hypura's expert cache sized by --gpu-mem 4GiB
    m=${MOE:?}; tag=$(basename "$m" .gguf)
    "$(libdir)/llama-bench" -m "$m" -ngl 99 -ncmoe 48,41 -t $T -p 0 -n 32 -r 3 -o json > "$RES/vanilla-$tag.json" 2> /dev/null
    grep -o '"n_cpu_moe": [0-9]*\|"avg_ts": [0-9.]*' "$RES/vanilla-$tag.json"
    for slots in ${SLOTS:--1}; do  # -1: as many as 4 GiB holds; misses copied only, then shared with the CPU
        for share in no-cpu-share cpu-share; do
            hy bench "$m" --gpu-mem 4GiB --expert-slots $slots --$share --profile $PROFILE -p 0 -n 32 -r 3 -t $T \
                --json "$RES/hypura-$tag-g4-s$slots-$share.json" 2>&1 | tail -4
        done
    done
    ;;
profile)  # this lease's machine profile, for the later phases: PROFILE=/tmp/res/profile.json
    python3 -m hypura.cli.main synth llama3.1-8b /tmp/l8.gguf --layers 16 --tokenizer-from $TOK > /dev/null 2>&1
    timeout 240 python3 -m hypura.cli.main profile --force --json --path /tmp --model /tmp/l8.gguf \
        > "$RES/profile.json" 2> "$RES/profile.err" && echo "profile: $RES/profile.json"
    ;;
numerics)  # prompt and decode logits with CPU weights streamed or paged, beside resident (bench/prompt_numerics.py)
    timeout 120 python3 bench/prompt_numerics.py $TOK .device/tiny-qwen3moe.gguf > "$RES/prompt-numerics.txt" 2>&1
    grep -a "max |diff|\|splits on\|Error" "$RES/prompt-numerics.txt" | tail -40
    ;;
diskreq)  # expert-sized O_DIRECT reads at 1-8 threads (bench/disk_requests.py) from MOE's file, cache dropped
    sync; echo 3 > /proc/sys/vm/drop_caches
    timeout 120 python3 bench/disk_requests.py ${MOE:?} "$RES/disk-requests.json"
    ;;
burst)  # bursts of expert-sized reads through the pager's pipeline, each waited for (bench/burst_reads.py), on
        # the profile's best reader count, cache dropped
    sync; echo 3 > /proc/sys/vm/drop_caches
    readers=$(python3 -c "import json, sys; d = json.load(open(sys.argv[1]))['disk']['by_threads']
print(max(d, key=lambda t: t[1])[0])" "$PROFILE")
    timeout 150 python3 bench/burst_reads.py ${MOE:?} "$RES/burst-reads.json" $readers
    ;;
faultin)  # how fast the pager can evict, fault in and fill expert-sized slices, no disk (bench/fault_in.py)
    timeout 120 python3 bench/fault_in.py "$RES/fault-in.json"
    ;;
queueing)  # does an activation copy wait behind weight copies? (the image's PyTorch, no Hypura)
    python3 bench/copy_queueing.py "$RES/copy-queueing.json" 2>&1 | tail -8
    ;;
moeplan)  # #5: the planner's own choice for an MoE model (MOE=path) at 4 GiB GPU and RAM=24GiB (default) or
          # less (disk-tier experts, read by selection), page cache dropped, beside vanilla -ncmoe NCMOE (41)
          # with the machine's whole RAM
    m=${MOE:?}; tag=$(basename "$m" .gguf); ram=${RAM:-24GiB}
    if [ "${SKIPV:-0}" != 1 ]; then  # SKIPV=1: this model's vanilla ran already in this call
        "$(libdir)/llama-bench" -m "$m" -ngl 99 -ncmoe ${NCMOE:-41} -t $T -p 0 -n 32 -r 3 -o json \
            > "$RES/vanilla-$tag-ncmoe${NCMOE:-41}.json" 2> /dev/null
        grep -o '"avg_ts": [0-9.]*' "$RES/vanilla-$tag-ncmoe${NCMOE:-41}.json"
    fi
    sync; echo 3 > /proc/sys/vm/drop_caches  # the plan may keep experts on disk: no page cache to hide in
    hy bench "$m" --gpu-mem 4GiB --ram $ram --profile $PROFILE -p 0 -n ${NGEN:-32} -r ${REPS:-3} $(threads) \
        --json "$RES/hypura-$tag-g4-r${ram%GiB}-planner${TAG:-}.json" 2>&1 | tail -10
    ;;
moewarm)  # #5: MOE at RAM cold (nothing recorded), then recorded (moerecord), then warm: the plan from its routing
    # cold means nothing recorded; the cold run saves what its decode routed, which the warm plan must not see
    HYPURA_ROUTING_DIR=/tmp/routing-cold-$RANDOM TAG=-cold SKIPV=1 phase moeplan || return 1
    export HYPURA_ROUTING_DIR=/tmp/routing-$(basename "${MOE:?}" .gguf)-$RANDOM
    phase moerecord && TAG=-warm SKIPV=1 phase moeplan
    ;;
moerecord)  # #5: record MOE's routing with one 512-token prompt (random tokens, as bench decodes), so the next
           # moeplan plans with expert frequencies (a warm start; `hypura routing` shows what was recorded)
    m=${MOE:?}; ram=${RAM:-24GiB}
    # another seed: bench decodes the first tokens of its random sequence, which must not be among those recorded
    hy bench "$m" --gpu-mem 4GiB --ram $ram --profile $PROFILE -p 512 -n 0 -r 1 -t $T --seed 1 2>&1 | grep prefill
    hy routing "$m" | tee -a "$RES/routing-$(basename "$m" .gguf).txt"
    ;;
vanillaram)  # #5: vanilla llama.cpp held to the same RAM budget (RAM=8GiB...) by a memory cgroup (v2 memory.max or
            # v1 limit_in_bytes; page cache counts), cache dropped, no repacking and no host buffers (anonymous copies
            # would not fit): its mmapped experts page in and out under the limit
    m=${MOE:?}; tag=$(basename "$m" .gguf); ram=${RAM:?}; out="$RES/vanilla-$tag-r${ram%GiB}-ncmoe${NCMOE:-41}.json"
    cg=$(memory_cgroup "$(( ${ram%GiB} << 30 ))") || { echo "no memory cgroup here: vanilla at $ram not run"; return 0; }
    sync; echo 3 > /proc/sys/vm/drop_caches
    bash -c "echo \$\$ > $cg/cgroup.procs; exec timeout ${VTIMEOUT:-240} '$(libdir)/llama-bench' -m '$m' -ngl 99 \
        -ncmoe ${NCMOE:-41} --repack 0 --no-host 1 -t $T -p 0 -n ${NGEN:-8} -r 2 -o json" > "$out" 2> /dev/null
    grep -o '"avg_ts": [0-9.]*' "$out" || echo "vanilla at $ram: no result (timed out after ${VTIMEOUT:-240} s?)"
    ;;
synthmix)  # a mixtral-8x7b-shaped Q5_K_M (32 GB) with quiet block outputs, after q3s is gone (disk space):
           # /tmp/mxu.gguf (uniform routers), or with SKEW=1 /tmp/mxs.gguf (skew 0.5, layer correlation 0.5)
           # in mxu's place
    rm -f /tmp/q3s.gguf
    if [ "${SKEW:-0}" = 1 ]; then rm -f /tmp/mxu.gguf; name=mxs; knobs="--router-skew 0.5 --router-layer-corr 0.5"
    else name=mxu; knobs=""; fi
    python3 -m hypura.cli.main synth mixtral-8x7b /tmp/$name.gguf --ftype q5_k_m --block-out-scale 0.002 $knobs \
        --tokenizer-from $TOK > "$RES/synth-$name.log" 2>&1
    ;;
synthmoe)  # MoE models for `moe` (after the 70B is gone: the disk holds ~64 GB): quiet block outputs, so
           # routing follows the routers at every layer; q3u: uniformly random (the worst case)
    rm -f $M70
    python3 -m hypura.cli.main synth qwen3-30b-a3b /tmp/q3u.gguf --block-out-scale 0.002 \
        --tokenizer-from $TOK > "$RES/synth-q3u.log" 2>&1 &
    python3 -m hypura.cli.main synth qwen3-30b-a3b /tmp/q3s.gguf --block-out-scale 0.002 --router-skew 0.5 \
        --router-layer-corr 0.5 --tokenizer-from $TOK > "$RES/synth-q3s.log" 2>&1
    wait
    ;;
disk)  # (b) 8 GiB GPU, 16 GiB RAM: part of the model streams from disk, page cache dropped first
    synth_done
    sync; echo 3 > /proc/sys/vm/drop_caches
    hy bench $M70 --gpu-mem 8GiB --ram 16GiB -p 0 -n 3 -r 2 -t $T --profile $PROFILE \
        --json "$RES/hypura-l70-g8-r16.json" 2>&1 | tail -5
    ;;
pack)
    cp /tmp/synth*.log "$RES/" 2> /dev/null
    tar czf "$OUT/results.tgz" -C "$RES" .
    ;;
*) echo "unknown phase $1"; exit 2 ;;
esac
}

for p in "$@"; do
    echo "### $p $(date +%T)"
    phase "$p" || { phase pack; exit 1; }
done
