#!/usr/bin/env bash
# next session, call 2 (prepared in session 15): the Mixtral shape (mxs: skew 0.5, layer correlation 0.5) at
# 8 GiB, cold (nothing recorded), with the shipped default threads (12 of 16) beside -t 16, A/B/A/B. Session
# 14 call 1 ran it at -t 16: 0.203 tok/s, 0.56 of the bound (0.36). Predicted: default ~0.3 (the q3s gain
# was 2.3x on a stall-bound decode; Mixtral's larger reads may gain less).
S=bench/h200_tier_runtime.sh; export SYNTH70=0 SYNTH14=0
t0=$SECONDS; log() { echo "=== $1 at $((SECONDS - t0)) s"; }
END=${END:-570}
rm -rf /tmp/res /tmp/routing-*
timeout 150 bash $S setup; log setup
export HYPURA_LIB_DIR=$(cat /tmp/hypura-lib) LD_LIBRARY_PATH=$(cat /tmp/hypura-lib) PYTHONPATH=/tmp/site:$PWD
timeout 60 bash $S profile; log profile
SKEW=1 timeout 120 bash $S synthmix; sync; log synth
export PROFILE=/tmp/res/profile.json MOE=/tmp/mxs.gguf RAM=8GiB NGEN=3 REPS=2 SKIPV=1
left() { echo $((END - (SECONDS - t0))); }
run() {  # tag, then env assignments (T=0: Hypura's default threads)
  [ $(left) -lt 70 ] && return 1
  d=$(mktemp -d /tmp/routing-run-XXXX); local tag=$1; shift
  env HYPURA_ROUTING_DIR=$d TAG=-cold-$tag "$@" timeout $(left) bash $S moeplan pack; log "$tag"
}
run default T=0; run t16 T=16; run default2 T=0
# vanilla mxs at 8 GiB: not re-run (session 14: see RESULTS)
bash $S pack
