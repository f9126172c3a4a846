#!/usr/bin/env bash
# next session, call 1 (prepared in session 15): the shipped default thread count on paged plans (12 of 16,
# expert_paging.llama_threads) beside -t 16, which session 15 could not run (device time spent).
# q3s 8 GiB warm: default, -t 16, default again, -t 16 with GOMP_SPINCOUNT=10000; q3u 8 GiB warm: default,
# -t 16; then vanilla q3u in a cgroup of 8 GiB, same lease. Predicted from session 15 call 1 (-t 12 4.36,
# -t 16 1.90): default ~2.3x the -t 16 run, at ~0.9 of the bound where the profile's disk is ~1.3 GB/s.
S=bench/h200_tier_runtime.sh; export SYNTH70=0 SYNTH14=0
t0=$SECONDS; log() { echo "=== $1 at $((SECONDS - t0)) s"; }
END=${END:-560}
rm -rf /tmp/res /tmp/routing-*
timeout 150 bash $S setup; log setup
export HYPURA_LIB_DIR=$(cat /tmp/hypura-lib) LD_LIBRARY_PATH=$(cat /tmp/hypura-lib) PYTHONPATH=/tmp/site:$PWD
timeout 60 bash $S profile; log profile
export PROFILE=/tmp/res/profile.json RAM=8GiB NGEN=16 REPS=3 SKIPV=1
timeout 90 bash $S synthmoe; sync; log synth
left() { echo $((END - (SECONDS - t0))); }
run() {  # tag, recorded routing dir, then env assignments for the bench (T=0: Hypura's default threads)
  [ $(left) -lt 45 ] && return 1
  d=$(mktemp -d /tmp/routing-run-XXXX); cp -r $2/. $d/
  local tag=$1; shift 2
  env HYPURA_ROUTING_DIR=$d TAG=-warm-$tag "$@" timeout $(left) bash $S moeplan pack; log "$tag"
}
for m in q3s q3u; do
  export MOE=/tmp/$m.gguf
  T=16 HYPURA_ROUTING_DIR=/tmp/routing-rec-$m timeout 60 bash $S moerecord pack; log record-$m
done
export MOE=/tmp/q3s.gguf
run default /tmp/routing-rec-q3s T=0; run t16 /tmp/routing-rec-q3s T=16; run default2 /tmp/routing-rec-q3s T=0
run t16-spin10k /tmp/routing-rec-q3s T=16 GOMP_SPINCOUNT=10000
export MOE=/tmp/q3u.gguf
run default /tmp/routing-rec-q3u T=0; run t16 /tmp/routing-rec-q3u T=16
[ $(left) -gt 70 ] && { T=16 NGEN=4 VTIMEOUT=$(( $(left) - 10 )) timeout $(left) bash $S vanillaram pack; log vanilla-q3u-8; }
bash $S pack
