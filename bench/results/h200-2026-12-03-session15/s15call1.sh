#!/usr/bin/env bash
# next session, call 1 (prepared in session 14): does OpenMP spinning slow the pager's reads in decode?
# q3s warm at 8 GiB: default (-t 16), GOMP_SPINCOUNT=10000, -t 12, OMP_WAIT_POLICY=passive, default again;
# then vanilla in a cgroup of 8 GiB in the same lease. Predicted (CPU VM: stall -24%): stall 282 -> ~220 ms a
# token, reads in the stall 0.97 -> ~1.3 GB/s, toward the 1.6-1.7 GB/s of burst_reads.py alone.
S=bench/h200_tier_runtime.sh; export SYNTH70=0 SYNTH14=0 T=16
t0=$SECONDS; log() { echo "=== $1 at $((SECONDS - t0)) s"; }
END=${END:-560}
rm -rf /tmp/res /tmp/routing-*
timeout 150 bash $S setup; log setup
export HYPURA_LIB_DIR=$(cat /tmp/hypura-lib) LD_LIBRARY_PATH=$(cat /tmp/hypura-lib) PYTHONPATH=/tmp/site:$PWD
timeout 60 bash $S profile; log profile
export PROFILE=/tmp/res/profile.json RAM=8GiB SKIPV=1 MOE=/tmp/q3s.gguf
timeout 90 bash $S synthmoe; sync; log synth
HYPURA_ROUTING_DIR=/tmp/routing-rec timeout 60 bash $S moerecord pack; log record
run() {  # tag, then env assignments for the bench
  left=$((END - (SECONDS - t0))); [ $left -lt 45 ] && return 1
  d=$(mktemp -d /tmp/routing-run-XXXX); cp -r /tmp/routing-rec/. $d/
  local tag=$1; shift
  env HYPURA_ROUTING_DIR=$d NGEN=16 REPS=3 TAG=-warm-$tag "$@" timeout $left bash $S moeplan pack; log "$tag"
}
run default; run spin10k GOMP_SPINCOUNT=10000; run t12 T=12; run passive OMP_WAIT_POLICY=passive; run default2
left=$((END - (SECONDS - t0)))
[ $left -gt 60 ] && { NGEN=4 VTIMEOUT=$((left - 10)) timeout $left bash $S vanillaram pack; log vanilla-q3s-8; }
bash $S pack
