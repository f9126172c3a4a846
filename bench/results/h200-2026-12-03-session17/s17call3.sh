#!/usr/bin/env bash
# session 17, call 3: disk prefetch guessed by the next layer's router on this layer's router input
# (HYPURA_DISK_PREFETCH=router, new) against no prefetch, ABAB on q3s warm and q3u warm, 8 GiB, default threads.
# CPU VM: precision 0.83, recall 0.68 on the 8-layer q3s. Predicted on the H200: ~14% more bytes read, reads
# overlapping ~1.3 ms a layer of compute and deeper queues: decode +10-25% (q3s 3.5 -> ~4.0-4.3 tok/s).
S=bench/h200_tier_runtime.sh; export SYNTH70=0 SYNTH14=0
t0=$SECONDS; log() { echo "=== $1 at $((SECONDS - t0)) s"; }
END=${END:-545}
rm -rf /tmp/res /tmp/routing-*
timeout 150 bash $S setup | grep -v "^PASSED"; log setup
export HYPURA_LIB_DIR=$(cat /tmp/hypura-lib) LD_LIBRARY_PATH=$(cat /tmp/hypura-lib) PYTHONPATH=/tmp/site:$PWD
timeout 60 bash $S profile; log profile
export PROFILE=/tmp/res/profile.json RAM=8GiB NGEN=16 REPS=3 SKIPV=1 T=0
timeout 90 bash $S synthmoe; sync; log synth
left() { echo $((END - (SECONDS - t0))); }
run() {  # tag, recorded routing dir, then env assignments for the bench
  [ $(left) -lt 50 ] && return 1
  d=$(mktemp -d /tmp/routing-run-XXXX); cp -r $2/. $d/
  local tag=$1; shift 2
  env HYPURA_ROUTING_DIR=$d TAG=-$tag "$@" timeout $(left) bash $S moeplan pack > /tmp/res/run-$tag.log 2>&1; log "$tag"
  python3 .device/summ.py "/tmp/res/hypura-*$tag.json" | tail -1
}
for m in q3s q3u; do
  export MOE=/tmp/$m.gguf
  T=16 HYPURA_ROUTING_DIR=/tmp/routing-rec-$m timeout 60 bash $S moerecord pack | grep -v "^###"; log record-$m
done
export MOE=/tmp/q3s.gguf; R=/tmp/routing-rec-q3s
run off $R HYPURA_DISK_PREFETCH=0; run router $R HYPURA_DISK_PREFETCH=router
run off2 $R HYPURA_DISK_PREFETCH=0; run router2 $R HYPURA_DISK_PREFETCH=router
export MOE=/tmp/q3u.gguf; R=/tmp/routing-rec-q3u
run off $R HYPURA_DISK_PREFETCH=0; run router $R HYPURA_DISK_PREFETCH=router
run off2 $R HYPURA_DISK_PREFETCH=0; run router2 $R HYPURA_DISK_PREFETCH=router
python3 .device/summ.py
bash $S pack > /dev/null
