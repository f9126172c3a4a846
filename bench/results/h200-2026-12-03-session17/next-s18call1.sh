#!/usr/bin/env bash
# next session, call 1 (prepared in session 17): HYPURA_DISK_PREFETCH=router with read-ahead faulted in by the
# fault-in threads (session 17's fix; measured on q3s only, in call 4), off/router ABAB on q3u (uniform routers), then q3s.
# Predicted: router within +-10% of off, no faster (a q3u token waits ~85% of its time on the disk; wrong guesses add ~9%).
S=bench/h200_tier_runtime.sh; export SYNTH70=0 SYNTH14=0
t0=$SECONDS; log() { echo "=== $1 at $((SECONDS - t0)) s"; }
END=${END:-540}
rm -rf /tmp/res /tmp/routing-*
timeout 150 bash $S setup | grep -v "^PASSED"; log setup
export HYPURA_LIB_DIR=$(cat /tmp/hypura-lib) LD_LIBRARY_PATH=$(cat /tmp/hypura-lib) PYTHONPATH=/tmp/site:$PWD
timeout 60 bash $S profile; log profile
export PROFILE=/tmp/res/profile.json RAM=8GiB NGEN=16 REPS=3 SKIPV=1 T=0
timeout 90 bash $S synthmoe; sync; log synth
left() { echo $((END - (SECONDS - t0))); }
run() {  # tag, recorded routing dir, then env assignments for the bench
  [ $(left) -lt 36 ] && return 1
  d=$(mktemp -d /tmp/routing-run-XXXX); cp -r $2/. $d/
  local tag=$1; shift 2
  env HYPURA_ROUTING_DIR=$d TAG=-$tag "$@" timeout $(left) bash $S moeplan pack > /tmp/res/run-$tag.log 2>&1; log "$tag"
  python3 .device/summ.py "/tmp/res/hypura-*$tag.json" | tail -1
}
for m in q3u q3s; do export MOE=/tmp/$m.gguf; R=/tmp/routing-rec-$m
T=16 HYPURA_ROUTING_DIR=$R timeout 60 bash $S moerecord pack | grep -v "^###"; log record-$m
run off $R HYPURA_DISK_PREFETCH=0; run router $R HYPURA_DISK_PREFETCH=router
run off2 $R HYPURA_DISK_PREFETCH=0; run router2 $R HYPURA_DISK_PREFETCH=router; done
bash $S pack > /dev/null
