#!/usr/bin/env bash
# session 18, call 1, fresh machine, no prebuilt library: build (lib parts to $OUT for later calls), models
# synthesised meanwhile, profile, q3s recorded, then the eviction A/B as time allows (s18call2.sh goes on, warm).
# (a) q3s: evictions while the reads run (HEAD) against before them (d81d257's tree). CPU VM: stall -5..-13%.
#     Predicted here: read while waiting / mean probe 0.75-0.84 -> 0.82-0.90; tok/s +5-8% if the disk holds.
source .device/s18common.sh
rm -rf /tmp/res /tmp/routing-*; mkdir -p /tmp/res
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
PYTHONPATH=/tmp/site:$PWD setsid nohup bash -c "bash $S synthmoe > /tmp/synthmoe.log 2>&1; echo \$? > /tmp/synthmoe.rc" > /dev/null 2>&1 &
timeout 500 bash $S setup | grep -v "^PASSED"; log setup
libenv
while [ ! -f /tmp/synthmoe.rc ]; do sleep 2; done; sync; log synth; ls -la /tmp/*.gguf
timeout 60 bash $S profile; log profile
record q3s
R=/tmp/routing-rec-q3s; export MOE=/tmp/q3s.gguf
run evict-before $R HYPURA_TREE=$OLD; run evict-meanwhile $R
python3 .device/summ.py
bash $S pack > /dev/null
