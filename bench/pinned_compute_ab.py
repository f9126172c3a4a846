"""The "before" side of an A/B: `hypura bench` with the CPU's compute buffer left in pinned memory
(llama.cpp's choice), as Hypura ran before hook API v8. Arguments as for `hypura bench`.

    python3 bench/pinned_compute_ab.py MODEL --gpu-mem 8GiB --ram 64GiB ... --json FILE
"""

import sys

import hypura.llama as hypura_llama
from hypura.cli.main import main


class _KeepPinned:
    def __init__(self, lib):
        self._lib = lib

    def __getattr__(self, name):
        if name == "hypura_cpu_compute_pageable":
            return lambda pageable: None
        return getattr(self._lib, name)


if __name__ == "__main__":
    real = hypura_llama.lib
    hypura_llama.lib = lambda: _KeepPinned(real())
    sys.argv = ["hypura", "bench", *sys.argv[1:]]
    main()
