#!/usr/bin/env bash
# session 18, call 4 (call 3's machine, warm): two more alternating rounds of the eviction A/B, q3u then q3s
source .device/s18common.sh
[ -f /tmp/hypura-lib ] && [ -d /tmp/routing-rec-q3s ] || { echo "not warm: nothing run"; exit 0; }
libenv
R=/tmp/routing-rec-q3u; export MOE=/tmp/q3u.gguf NEED=50
run u-evict-meanwhile3 $R; run u-evict-before3 $R HYPURA_TREE=$OLD
R=/tmp/routing-rec-q3s; export MOE=/tmp/q3s.gguf NEED=45
run evict-before4 $R HYPURA_TREE=$OLD; run evict-meanwhile4 $R
R=/tmp/routing-rec-q3u; export MOE=/tmp/q3u.gguf NEED=50
run u-evict-before4 $R HYPURA_TREE=$OLD; run u-evict-meanwhile4 $R
python3 .device/summ.py "/tmp/res/hypura-*[34].json"
bash $S pack > /dev/null
