#!/usr/bin/env bash
# next session, call 1 (prepared in session 17). Two A/Bs, each ABAB in one lease, 8 GiB, warm, default threads:
# (a) q3s: evictions while the reads run (HEAD) against before them (the tree of d81d257, carried in .device/).
#     CPU VM, model on a RAM-backed loop device: stall -5..-13%. Predicted here: the reads' share of the probed rate
#     (read while waiting / mean probe) 0.75-0.84 -> 0.82-0.90; tok/s +5-8% if the disk holds still.
# (b) q3u: HYPURA_DISK_PREFETCH=router against off, with read-ahead faulted in by the fault-in threads (session 17
#     measured that path on q3s only). Predicted: within +-10% of off, no faster.
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
  T=16 MOE=/tmp/$m.gguf HYPURA_ROUTING_DIR=/tmp/routing-rec-$m timeout 60 bash $S moerecord pack | grep -v "^###"; log record-$m
done
OLD=$PWD/.device/tree-d81d257
export MOE=/tmp/q3s.gguf; R=/tmp/routing-rec-q3s
run evict-before $R HYPURA_TREE=$OLD; run evict-meanwhile $R
run evict-before2 $R HYPURA_TREE=$OLD; run evict-meanwhile2 $R
export MOE=/tmp/q3u.gguf; R=/tmp/routing-rec-q3u
run off $R HYPURA_DISK_PREFETCH=0; run router $R HYPURA_DISK_PREFETCH=router
run off2 $R HYPURA_DISK_PREFETCH=0; run router2 $R HYPURA_DISK_PREFETCH=router
python3 .device/summ.py
bash $S pack > /dev/null
