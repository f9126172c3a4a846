#!/usr/bin/env bash
# session 17, call 4 (the device time left: ~400 s): router prefetch with fault-in moved off the readers onto the
# fault-in threads (as demand reads have it), and waits for read-ahead counted as stall. q3s warm, off/router ABAB.
# Call 3: router prefetch 2.86/3.06 vs off 4.47/2.98 tok/s (precision 0.87, 13% more bytes). Predicted now: router
# within +-10% of off, no better: a token's compute that reads could hide is ~13-15% of it, and the wrong guesses
# add 13% bytes. Profile from call 3 (carried), to save its 25 s.
S=bench/h200_tier_runtime.sh; export SYNTH70=0 SYNTH14=0
t0=$SECONDS; log() { echo "=== $1 at $((SECONDS - t0)) s"; }
END=${END:-255}
rm -rf /tmp/res /tmp/routing-*
timeout 150 bash $S setup | grep -v "^PASSED"; log setup
export HYPURA_LIB_DIR=$(cat /tmp/hypura-lib) LD_LIBRARY_PATH=$(cat /tmp/hypura-lib) PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/res; cp .device/profile-s17c3.json /tmp/res/profile.json
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
export MOE=/tmp/q3s.gguf; R=/tmp/routing-rec-q3s
T=16 HYPURA_ROUTING_DIR=$R timeout 60 bash $S moerecord pack | grep -v "^###"; log record-q3s
run off $R HYPURA_DISK_PREFETCH=0; run router $R HYPURA_DISK_PREFETCH=router
run off2 $R HYPURA_DISK_PREFETCH=0; run router2 $R HYPURA_DISK_PREFETCH=router
bash $S pack > /dev/null
