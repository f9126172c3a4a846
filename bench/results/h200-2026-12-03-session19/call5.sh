#!/usr/bin/env bash
# session 19, call 5 (fresh machine, prebuilt library): more samples of #5's "measured / bound" for the shipped pager
# (evictions meanwhile, 5-6% faster reads than before in call 1's interleaved test): q3u and q3s at --ram 8GiB,
# alternating until the time is spent. Session 18's 10 runs of this code: 0.69-0.94 of the probed bound, median 0.81.
# Predicted: 0.75-0.9, median ~0.82.
source .device/s18common.sh
END=${END:-360}  # the device time left (538 s) less a machine start; pack after each run in case of a kill
rm -rf /tmp/res /tmp/routing-*; mkdir -p /tmp/res
timeout 150 bash $S setup | grep -v "^PASSED"; log setup; libenv
timeout 60 bash $S profile; log profile
timeout 90 bash $S synthmoe; sync; log synth
record q3u; record q3s
for i in 1 2 3; do
  R=/tmp/routing-rec-q3u; export MOE=/tmp/q3u.gguf NEED=50; run u-head$i $R || break; bash $S pack > /dev/null
  R=/tmp/routing-rec-q3s; export MOE=/tmp/q3s.gguf NEED=45; run s-head$i $R || break; bash $S pack > /dev/null
done
python3 .device/summ.py
bash $S pack > /dev/null
