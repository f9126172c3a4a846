#!/usr/bin/env bash
# session 16, call 4: the bench's disk probe (runtime/disk_probe.py) beside the shipped default threads. q3s warm
# x2, q3u warm, mxs cold, 8 GiB, each probing the disk with its own expert reads before and after its runs.
# Predicted: probes 1.3-1.8 GB/s (below the profile's sequential 4 MiB rate); decode at 0.7-0.85 of the bound
# at the probed rate for Qwen, ~0.9 for Mixtral (40 MB slices).
S=bench/h200_tier_runtime.sh; export SYNTH70=0 SYNTH14=0
t0=$SECONDS; log() { echo "=== $1 at $((SECONDS - t0)) s"; }
END=${END:-420}
rm -rf /tmp/res /tmp/routing-*
timeout 150 bash $S setup; log setup
export HYPURA_LIB_DIR=$(cat /tmp/hypura-lib) LD_LIBRARY_PATH=$(cat /tmp/hypura-lib) PYTHONPATH=/tmp/site:$PWD
timeout 60 bash $S profile; log profile
export PROFILE=/tmp/res/profile.json RAM=8GiB NGEN=16 REPS=3 SKIPV=1 T=0
timeout 90 bash $S synthmoe; sync; log synth
left() { echo $((END - (SECONDS - t0))); }
run() {  # tag, recorded routing dir ('' : cold), then env assignments for the bench
  [ $(left) -lt 45 ] && return 1
  d=$(mktemp -d /tmp/routing-run-XXXX); [ -n "$2" ] && cp -r $2/. $d/
  local tag=$1; shift 2
  env HYPURA_ROUTING_DIR=$d TAG=-$tag "$@" timeout $(left) bash $S moeplan pack; log "$tag"
}
for m in q3s q3u; do
  export MOE=/tmp/$m.gguf
  T=16 HYPURA_ROUTING_DIR=/tmp/routing-rec-$m timeout 60 bash $S moerecord pack; log record-$m
done
export MOE=/tmp/q3s.gguf; run warm-probe /tmp/routing-rec-q3s; run warm-probe2 /tmp/routing-rec-q3s
export MOE=/tmp/q3u.gguf; run warm-probe /tmp/routing-rec-q3u
[ $(left) -gt 110 ] && { SKEW=1 timeout 60 bash $S synthmix; sync; log synthmix; \
  MOE=/tmp/mxs.gguf; run cold-probe '' NGEN=3 REPS=2; }
bash $S pack
