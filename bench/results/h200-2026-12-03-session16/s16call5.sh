#!/usr/bin/env bash
# session 16, call 5: the profile's random expert-sized reads (1 MiB, 4 KiB-aligned random offsets) beside its
# sequential 4 MiB ones, and a plan that times disk experts at that rate: q3s 8 GiB warm, default threads.
# Predicted: random 1 MiB at 1.2-1.7 GB/s (call 4's probes: 1.06-1.57); the plan's prediction for q3s falls from
# ~10 to ~5-6 tok/s, and measured/bound (profile) rises from ~0.45 to ~0.7.
S=bench/h200_tier_runtime.sh; export SYNTH70=0 SYNTH14=0
t0=$SECONDS; log() { echo "=== $1 at $((SECONDS - t0)) s"; }
END=${END:-190}
rm -rf /tmp/res /tmp/routing-*
timeout 150 bash $S setup; log setup
export HYPURA_LIB_DIR=$(cat /tmp/hypura-lib) LD_LIBRARY_PATH=$(cat /tmp/hypura-lib) PYTHONPATH=/tmp/site:$PWD
timeout 60 bash $S profile; log profile
python3 -c "import json; d=json.load(open('/tmp/res/profile.json'))['disk']; print('sequential', d['by_threads'], 'random', d['random_by_threads'])"
export PROFILE=/tmp/res/profile.json RAM=8GiB NGEN=16 REPS=3 SKIPV=1 T=0 MOE=/tmp/q3s.gguf
timeout 60 bash $S synthmoe; sync; log synth
left() { echo $((END - (SECONDS - t0))); }
T=16 HYPURA_ROUTING_DIR=/tmp/routing-rec timeout $(left) bash $S moerecord; log record
[ $(left) -gt 30 ] && { d=$(mktemp -d /tmp/routing-run-XXXX); cp -r /tmp/routing-rec/. $d/
  HYPURA_ROUTING_DIR=$d TAG=-warm-random timeout $(left) bash $S moeplan; log warm; }
true
