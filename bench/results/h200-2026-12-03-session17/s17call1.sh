#!/usr/bin/env bash
# next session, call 1 (prepared in session 16): the probe now reads other experts after the runs than before
# (session 16's two probes shared a seed and "after" read 1-28% faster: a storage cache?). q3s warm x2 and q3u
# warm at default threads, then q3s warm with the pager's readers set to the profile's best thread count for
# random 1 MiB reads instead of sequential 4 MiB (a profile copy whose sequential best is that count).
# Predicted: before and after probes within ~10% of each other; decode at 0.75-0.85 of the probed bound.
S=bench/h200_tier_runtime.sh; export SYNTH70=0 SYNTH14=0
t0=$SECONDS; log() { echo "=== $1 at $((SECONDS - t0)) s"; }
END=${END:-540}
rm -rf /tmp/res /tmp/routing-*
timeout 150 bash $S setup; log setup
export HYPURA_LIB_DIR=$(cat /tmp/hypura-lib) LD_LIBRARY_PATH=$(cat /tmp/hypura-lib) PYTHONPATH=/tmp/site:$PWD
timeout 60 bash $S profile; log profile
python3 - <<'PY'
import json
d = json.load(open("/tmp/res/profile.json")); disk = d["disk"]
print("sequential", disk["by_threads"], "random", disk["random_by_threads"])
best = max(disk["random_by_threads"], key=lambda tb: tb[1])[0]
disk["by_threads"] = [t for t in disk["by_threads"] if t[0] != best] + [[best, disk["read_bw"] * 1.0001]]
json.dump(d, open("/tmp/res/profile-random-readers.json", "w"))
print("readers for random reads:", best)
PY
export PROFILE=/tmp/res/profile.json RAM=8GiB NGEN=16 REPS=3 SKIPV=1 T=0
timeout 90 bash $S synthmoe; sync; log synth
left() { echo $((END - (SECONDS - t0))); }
run() {  # tag, recorded routing dir, then env assignments for the bench
  [ $(left) -lt 45 ] && return 1
  d=$(mktemp -d /tmp/routing-run-XXXX); cp -r $2/. $d/
  local tag=$1; shift 2
  env HYPURA_ROUTING_DIR=$d TAG=-$tag "$@" timeout $(left) bash $S moeplan pack; log "$tag"
}
for m in q3s q3u; do
  export MOE=/tmp/$m.gguf
  T=16 HYPURA_ROUTING_DIR=/tmp/routing-rec-$m timeout 60 bash $S moerecord pack; log record-$m
done
export MOE=/tmp/q3s.gguf
run warm /tmp/routing-rec-q3s; run warm-random-readers /tmp/routing-rec-q3s PROFILE=/tmp/res/profile-random-readers.json
run warm2 /tmp/routing-rec-q3s
export MOE=/tmp/q3u.gguf; run warm /tmp/routing-rec-q3u
bash $S pack
