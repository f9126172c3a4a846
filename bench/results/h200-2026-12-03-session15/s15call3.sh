#!/usr/bin/env bash
# session 15, call 3: are a layer's ~6 expert reads of ~1 MB bound by rounds over too few readers? The plan takes
# the profile's best thread count for 4 MiB requests (2 on call 2's disk). q3s 8 GiB warm at the profile's count,
# 4, 8, the profile's again, 8 again (the profile copy gives its read_bw to N threads: bound unchanged).
# Predicted: 8 readers, one round a layer: reads in the stall ~1.0 -> ~1.6 GB/s, stall ~240 -> ~150 ms/token.
S=bench/h200_tier_runtime.sh; export SYNTH70=0 SYNTH14=0 T=16
t0=$SECONDS; log() { echo "=== $1 at $((SECONDS - t0)) s"; }
END=${END:-570}
rm -rf /tmp/res /tmp/routing-*
timeout 150 bash $S setup; log setup
export HYPURA_LIB_DIR=$(cat /tmp/hypura-lib) LD_LIBRARY_PATH=$(cat /tmp/hypura-lib) PYTHONPATH=/tmp/site:$PWD
timeout 60 bash $S profile; log profile
for n in 4 8; do python3 - $n <<'PY'
import json, sys
n = int(sys.argv[1]); d = json.load(open("/tmp/res/profile.json"))
d["disk"]["by_threads"] = [t for t in d["disk"]["by_threads"] if t[0] != n] + [[n, d["disk"]["read_bw"] * 1.0001]]
json.dump(d, open(f"/tmp/res/profile-readers{n}.json", "w"))
PY
done
export PROFILE=/tmp/res/profile.json MOE=/tmp/q3s.gguf RAM=8GiB NGEN=16 REPS=3 SKIPV=1
timeout 90 bash $S synthmoe; sync; log synth
left() { echo $((END - (SECONDS - t0))); }
run() {  # tag, then env assignments for the bench
  [ $(left) -lt 45 ] && return 1
  d=$(mktemp -d /tmp/routing-run-XXXX); cp -r /tmp/routing-rec/. $d/
  local tag=$1; shift
  env HYPURA_ROUTING_DIR=$d TAG=-warm-$tag "$@" timeout $(left) bash $S moeplan pack; log "$tag"
}
HYPURA_ROUTING_DIR=/tmp/routing-rec timeout 60 bash $S moerecord pack; log record
run readers-profile; run readers4 PROFILE=/tmp/res/profile-readers4.json
run readers8 PROFILE=/tmp/res/profile-readers8.json; run readers-profile-b
run readers8-b PROFILE=/tmp/res/profile-readers8.json
bash $S pack
# then resident hybrid q3u at 24 GiB, more A/B pairs of the spin (call 2's: 49.6/52.1 against 49.5/58.0)
export MOE=/tmp/q3u.gguf RAM=24GiB NGEN=32
run24() { [ $(left) -lt 30 ] && return 1; d=$(mktemp -d /tmp/routing-run-XXXX)
  local tag=$1; shift; env HYPURA_ROUTING_DIR=$d TAG=-$tag "$@" timeout $(left) bash $S moeplan pack; log "$tag"; }
run24 spin300k-c GOMP_SPINCOUNT=300000; run24 spin10k-c; run24 spin300k-d GOMP_SPINCOUNT=300000; run24 spin10k-d
bash $S pack
