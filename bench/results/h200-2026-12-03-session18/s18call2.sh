#!/usr/bin/env bash
# session 18, call 2: on call 1's machine if still warm (else a fresh one from .prebuilt): the rest of the A/Bs.
# (a) q3s eviction A/B, second round (BABA after call 1's AB);
# (b) q3u: HYPURA_DISK_PREFETCH=router against off, ABAB. Predicted: router within +-10% of off, no faster.
source .device/s18common.sh
if [ ! -f /tmp/hypura-lib ]; then
  echo "fresh machine"; rm -rf /tmp/res /tmp/routing-*; mkdir -p /tmp/res
  timeout 150 bash $S setup | grep -v "^PASSED"; log setup; libenv
  timeout 60 bash $S profile; log profile
  timeout 90 bash $S synthmoe; sync; log synth
else
  echo "warm machine"; libenv; rm -f /tmp/res/*.json.gz /tmp/res/results.tgz
fi
record q3s; record q3u
R=/tmp/routing-rec-q3s; export MOE=/tmp/q3s.gguf
run evict-meanwhile2 $R; run evict-before2 $R HYPURA_TREE=$OLD
R=/tmp/routing-rec-q3u; export MOE=/tmp/q3u.gguf NEED=55
run off $R HYPURA_DISK_PREFETCH=0; run router $R HYPURA_DISK_PREFETCH=router
run off2 $R HYPURA_DISK_PREFETCH=0; run router2 $R HYPURA_DISK_PREFETCH=router
python3 .device/summ.py
bash $S pack > /dev/null
