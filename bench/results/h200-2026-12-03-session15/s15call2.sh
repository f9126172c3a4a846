#!/usr/bin/env bash
# session 15, call 2: GOMP_SPINCOUNT=10000 is now set by `import hypura`. Does it cost the resident hybrid
# (q3u at 24 GiB: the CPU computes ~41 layers' experts, a split per layer)? A/B/A/B against libgomp's old
# 300000. Then the uniform shape at 8 GiB warm (default, 300k, default), then q3s 8 GiB at 3000 and 30000.
S=bench/h200_tier_runtime.sh; export SYNTH70=0 SYNTH14=0 T=16
t0=$SECONDS; log() { echo "=== $1 at $((SECONDS - t0)) s"; }
END=${END:-560}
rm -rf /tmp/res /tmp/routing-*
timeout 150 bash $S setup; log setup
export HYPURA_LIB_DIR=$(cat /tmp/hypura-lib) LD_LIBRARY_PATH=$(cat /tmp/hypura-lib) PYTHONPATH=/tmp/site:$PWD
timeout 60 bash $S profile; log profile
export PROFILE=/tmp/res/profile.json
timeout 90 bash $S synthmoe; sync; log synth
left() { echo $((END - (SECONDS - t0))); }
run() {  # tag, routing dir to copy ("" = none), then env assignments for the bench
  [ $(left) -lt 50 ] && return 1
  d=$(mktemp -d /tmp/routing-run-XXXX); [ -n "$2" ] && cp -r $2/. $d/
  local tag=$1; shift 2
  env HYPURA_ROUTING_DIR=$d TAG=-$tag "$@" timeout $(left) bash $S moeplan pack; log "$tag"
}
export MOE=/tmp/q3u.gguf RAM=24GiB NGEN=32 REPS=3
run spin10k-a "" SKIPV=0; run spin300k-a "" SKIPV=1 GOMP_SPINCOUNT=300000
run spin10k-b "" SKIPV=1; run spin300k-b "" SKIPV=1 GOMP_SPINCOUNT=300000
export RAM=8GiB NGEN=16 SKIPV=1
HYPURA_ROUTING_DIR=/tmp/routing-rec-u timeout 60 bash $S moerecord pack; log record-u
run warm-spin10k /tmp/routing-rec-u; run warm-spin300k /tmp/routing-rec-u GOMP_SPINCOUNT=300000
run warm-spin10k-b /tmp/routing-rec-u
export MOE=/tmp/q3s.gguf
[ $(left) -gt 110 ] && { HYPURA_ROUTING_DIR=/tmp/routing-rec-s timeout 60 bash $S moerecord pack; log record-s; }
run warm-spin3k /tmp/routing-rec-s GOMP_SPINCOUNT=3000; run warm-spin30k /tmp/routing-rec-s GOMP_SPINCOUNT=30000
bash $S pack
