"""Which candidate placement a plan keeps: the fastest chat turn, except that llama.cpp's kind of placement
(nothing streamed into GPU slots: its kernels, CPU weights as it holds them or pinned as its -lm none does) is
kept unless streaming predicts a gain beyond the cost model's error (knobs.STREAM_GAIN_MIN). Within that error
what llama.cpp itself would run is never the slower. The choice and its reason go on the solution (`why`).
"""

from __future__ import annotations

import dataclasses

from hypura.plan import knobs


def choose(solutions: list):
    """The kept one of `solutions` (solve.Solution: `streams`, `turn_s`, `prediction`), with its `why`."""
    best = min(solutions, key=lambda s: s.turn_s)  # min() keeps the first of equals
    if not best.streams:
        rival = min((s for s in solutions if s.streams), key=lambda s: s.turn_s, default=None)
        return best if rival is None else dataclasses.replace(
            best, why=f"llama.cpp's kind of placement (nothing streamed): predicts {best.prediction.decode_tok_s:.2f} "
                      f"tok/s decode, the best streaming plan {rival.prediction.decode_tok_s:.2f}")
    plain = min((s for s in solutions if not s.streams), key=lambda s: s.turn_s, default=None)
    if plain is None:
        return best
    # a plan for several sequences counts its aggregate decode too (its turn weighs the one sequence's most)
    gain = max(plain.turn_s / best.turn_s - 1,
               best.prediction.decode_tok_s / plain.prediction.decode_tok_s - 1 if best.prediction.parallel > 1 else 0)
    if gain < knobs.STREAM_GAIN_MIN:
        return dataclasses.replace(plain, why=f"llama.cpp's kind of placement (nothing streamed): the best streaming "
                                              f"plan predicts only {gain:.0%} faster, within the cost model's error "
                                              f"({knobs.STREAM_GAIN_MIN:.0%})")
    return dataclasses.replace(best, why=f"streaming predicts {gain:.0%} faster than llama.cpp's kind of placement "
                                         f"({plain.prediction.decode_tok_s:.2f} tok/s decode)")


__all__ = ["choose"]
