# shared by s18call1/2: paths, timing and one bench run per A/B arm
S=bench/h200_tier_runtime.sh; export SYNTH70=0 SYNTH14=0
t0=$SECONDS; log() { echo "=== $1 at $((SECONDS - t0)) s"; }
END=${END:-550}
left() { echo $((END - (SECONDS - t0))); }
libenv() { export HYPURA_LIB_DIR=$(cat /tmp/hypura-lib) LD_LIBRARY_PATH=$(cat /tmp/hypura-lib) PYTHONPATH=/tmp/site:$PWD; }
run() {  # tag, recorded routing dir, then env assignments for the bench; needs ~75 s (q3s) or ~50 s (q3u)
  [ $(left) -lt ${NEED:-75} ] && { echo "skip $1: $(left) s left"; return 1; }
  d=$(mktemp -d /tmp/routing-run-XXXX); cp -r $2/. $d/
  local tag=$1; shift 2
  env HYPURA_ROUTING_DIR=$d TAG=-$tag "$@" timeout $(left) bash $S moeplan pack > /tmp/res/run-$tag.log 2>&1; log "$tag"
  python3 .device/summ.py "/tmp/res/hypura-*$tag.json" | tail -1
}
record() {  # model tag: its routing, once per machine
  [ -d /tmp/routing-rec-$1 ] && return 0
  T=16 MOE=/tmp/$1.gguf HYPURA_ROUTING_DIR=/tmp/routing-rec-$1 timeout 60 bash $S moerecord pack | grep -v "^###"; log record-$1
}
export PROFILE=/tmp/res/profile.json RAM=8GiB NGEN=16 REPS=3 SKIPV=1 T=0
OLD=$PWD/.device/tree-d81d257
