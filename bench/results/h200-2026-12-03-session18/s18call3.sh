#!/usr/bin/env bash
# session 18, call 3 (fresh machine, prebuilt library): the eviction A/B again, now on q3u too (more reads a token:
# 0.43 GB against q3s's 0.28), alternating. Calls 1-2 on q3s: read while waiting / mean probe 0.77, 0.69 before
# against 1.00, 0.92 with evictions meanwhile. Predicted on q3u: the same shift, 0.75-0.8 -> 0.9-1.0.
source .device/s18common.sh
rm -rf /tmp/res /tmp/routing-*; mkdir -p /tmp/res
timeout 150 bash $S setup | grep -v "^PASSED"; log setup; libenv
timeout 60 bash $S profile; log profile
timeout 90 bash $S synthmoe; sync; log synth
record q3u; record q3s
R=/tmp/routing-rec-q3u; export MOE=/tmp/q3u.gguf NEED=55
run u-evict-before $R HYPURA_TREE=$OLD; run u-evict-meanwhile $R
run u-evict-before2 $R HYPURA_TREE=$OLD; run u-evict-meanwhile2 $R
R=/tmp/routing-rec-q3s; export MOE=/tmp/q3s.gguf NEED=50
run evict-meanwhile3 $R; run evict-before3 $R HYPURA_TREE=$OLD
python3 .device/summ.py
bash $S pack > /dev/null
