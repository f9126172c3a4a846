"""How a plan's load reads the model file: through the page cache, or around it with O_DIRECT.

The one decision, from the files' residency now (tiers/residency.py). A file the cache holds is
read through it: its pages are in RAM already, so reading them costs a copy at memory speed and no new
memory (the weights' own buffers are in the plan's budget either way). A cold file is read with
O_DIRECT at the disk's rate: buffered, every byte read would stay in the cache beside the plan's RAM,
memory the budget does not see.

A file partly cached (at least CACHED_MIN) is read through the cache too, and the pages that were not cached
before the load are dropped from it after (`settle`): the cache ends the load as it began.

It decides llama.cpp's load mode (NONE: buffered reads into the weights' buffers, never mapped; or
DIRECT_IO) and how Hypura's own load-time fills read (runtime/placement.py FileFiller). Reads while
decoding (streamed layers, paged experts) stay O_DIRECT: the plan predicts them at the disk's rate.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import llama_cpp

from hypura.tiers.residency import cached_share, drop, uncached_runs

# "mostly cached": at least half the file reads at memory speed, the rest through the cache at about the disk's rate
# (and is dropped again after the load); below that, O_DIRECT's large aligned requests, which never touch the cache.
# On the CPU VM a file the kernel had evicted a sixth of under other jobs' memory (83 % cached) loaded at the disk's
# rate with the former 90 %
CACHED_MIN = 0.5


@dataclass(frozen=True)
class LoadReads:
    buffered: bool  # through the page cache; else O_DIRECT
    share: float  # of the model's bytes in the page cache when measured (the least of its files)
    asked: bool = False  # the caller's load mode (none or dio), not the residency, decided
    cold: tuple = ()  # (path, [(offset, length), ...]): what was not cached before a buffered load

    def settle(self) -> None:
        """After the load: a buffered load's pages that were not cached before leave the cache again."""
        for path, runs in self.cold:
            drop(path, runs)

    @property
    def load_mode(self) -> int:
        return llama_cpp.LLAMA_LOAD_MODE_NONE if self.buffered else llama_cpp.LLAMA_LOAD_MODE_DIRECT_IO

    @property
    def line(self) -> str:
        """The one line of why, for verbose output."""
        if self.buffered:
            rest = "; what it adds leaves it after the load" if self.cold else ""
            how = f"reads through the cache (its pages are in RAM already{rest})"
        else:
            how = "reads with O_DIRECT at the disk's rate (a cold file is not pulled into the cache)"
        why = "as the load mode given asks" if self.asked else f"at least {CACHED_MIN:.0%} cached reads through it"
        return f"hypura: load: {self.share:.0%} of the model file in the page cache, {how}; {why}"


def load_reads(paths: list[str | os.PathLike], given: int | None = None) -> LoadReads:
    """The decision for a model of these files: buffered only where every one is mostly cached; a load mode
    the caller gave (llama.cpp's NONE or DIRECT_IO, neither of which maps the file) stands."""
    shares = [cached_share(p) for p in paths]
    share = min(shares, default=0.0)
    if given in (llama_cpp.LLAMA_LOAD_MODE_NONE, llama_cpp.LLAMA_LOAD_MODE_DIRECT_IO):
        return LoadReads(buffered=given == llama_cpp.LLAMA_LOAD_MODE_NONE, share=share, asked=True)
    if share < CACHED_MIN:
        return LoadReads(buffered=False, share=share)
    # partly cached: what is cold now, to drop after (a file sampled as all cached may still miss a few pages)
    cold = tuple((str(p), runs) for p, s in zip(paths, shares) if s < 1.0 and (runs := uncached_runs(p)))
    return LoadReads(buffered=True, share=share, cold=cold)
