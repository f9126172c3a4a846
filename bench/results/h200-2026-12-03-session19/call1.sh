#!/usr/bin/env bash
# next session, call 1 (prepared in session 18); bench/device_prep.sh copies it to .device/s19call1.sh. From the repo root:
#   bash .device/s19call1.sh > $OUT/log.txt 2>&1     carry [".whl", ".device"] (no library needed)
# (1) bench/evict_order.py: evict-then-read against read-and-evict-meanwhile, interleaved burst by burst, so the
#     disk's drift falls on both. CPU VM: meanwhile/before 1.05-1.07. Predicted here: 1.03-1.08 (the H200's
#     fault-in threads wait for the evictions in the new order; the evictions themselves ~0.5 ms of a ~7 ms burst).
# (2) bench/zero_copy_rate.py (CuPy only): a kernel reading 8 random 2.86 MB experts a launch from pinned host
#     memory, beside the copy engine and HBM. Predicted 35-50 GB/s, which puts a static CPU+GPU split of the
#     Qwen shape at 24 GiB at 1.3-1.5x llama.cpp at most (the target is 1.5x).
source .device/s18common.sh
rm -rf /tmp/res /tmp/routing-*; mkdir -p /tmp/res
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 120 python3 bench/zero_copy_rate.py /tmp/res/zero-copy-rate.json; log zero-copy
python3 -c "
import numpy as np  # 8 GiB of incompressible bytes, written once: the page cache is dropped before reading
c = [np.random.default_rng(i).integers(0, 255, 64 << 20, dtype=np.uint8).tobytes() for i in range(8)]
with open('/tmp/big.bin', 'wb') as f:
    [f.write(c[i % 8]) for i in range(128)]"
sync; echo 3 > /proc/sys/vm/drop_caches; log file
for a in "2 9 10" "2 24 6" "4 9 6" "1 9 6"; do set -- $a
  echo "== readers $1, bursts of $2 slices"
  timeout 90 python3 bench/evict_order.py /tmp/big.bin /tmp/res/evict-order-r$1-b$2.json $1 $2 $3
done; log evict-order
bash $S pack > /dev/null
