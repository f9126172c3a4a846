#!/usr/bin/env bash
# session 17, call 2: are libgomp's spinning workers what slows decode's reads below the probe's rate?
# Call 1: reads ran at 1.06 GB/s while decode waited, 1.27-1.47 GB/s in the probe (between decodes, workers
# asleep). A/B on q3s warm (same recording copied per run): default, OMP_WAIT_POLICY=PASSIVE (12 threads),
# PASSIVE at 16 threads, GOMP_SPINCOUNT=10000; then q3u default vs PASSIVE.
# Predicted: PASSIVE reads at ~1.3 GB/s in stall, q3s 3.3 -> ~4.0 tok/s; PASSIVE-16 about the same as PASSIVE-12.
S=bench/h200_tier_runtime.sh; export SYNTH70=0 SYNTH14=0
t0=$SECONDS; log() { echo "=== $1 at $((SECONDS - t0)) s"; }
END=${END:-560}
rm -rf /tmp/res /tmp/routing-*
timeout 150 bash $S setup; log setup
export HYPURA_LIB_DIR=$(cat /tmp/hypura-lib) LD_LIBRARY_PATH=$(cat /tmp/hypura-lib) PYTHONPATH=/tmp/site:$PWD
timeout 60 bash $S profile; log profile
export PROFILE=/tmp/res/profile.json RAM=8GiB NGEN=16 REPS=3 SKIPV=1 T=0
timeout 90 bash $S synthmoe; sync; log synth
left() { echo $((END - (SECONDS - t0))); }
run() {  # tag, recorded routing dir, then env assignments for the bench
  [ $(left) -lt 45 ] && return 1
  d=$(mktemp -d /tmp/routing-run-XXXX); cp -r $2/. $d/
  local tag=$1; shift 2
  env HYPURA_ROUTING_DIR=$d TAG=-$tag "$@" timeout $(left) bash $S moeplan pack | grep -v "^###"; log "$tag"
}
for m in q3s q3u; do
  export MOE=/tmp/$m.gguf
  T=16 HYPURA_ROUTING_DIR=/tmp/routing-rec-$m timeout 60 bash $S moerecord pack | grep -v "^###"; log record-$m
done
export MOE=/tmp/q3s.gguf
R=/tmp/routing-rec-q3s
run default $R; run passive $R OMP_WAIT_POLICY=PASSIVE; run passive16 $R OMP_WAIT_POLICY=PASSIVE T=16
run spin10k $R GOMP_SPINCOUNT=10000; run default2 $R; run passive2 $R OMP_WAIT_POLICY=PASSIVE
export MOE=/tmp/q3u.gguf; R=/tmp/routing-rec-q3u
run default $R; run passive $R OMP_WAIT_POLICY=PASSIVE
bash $S pack > /dev/null
