"""Which candidate placement a plan keeps: the fastest chat turn, except that llama.cpp's kind of placement
(nothing streamed into GPU slots: its kernels, CPU weights as it holds them or pinned as its -lm none does) is
kept unless streaming predicts a gain beyond the cost model's error (knobs.STREAM_GAIN_MIN): in a chat turn, or for a
plan for several sequences in its aggregate decode at its own step or at the fewer it runs as clients come and go. Within that error
what llama.cpp itself would run is never the slower. The choice and its reason go on the solution (`why`).
"""

from __future__ import annotations

import dataclasses

from hypura.plan import knobs
from hypura.tiers.names import GPU


def beside_gpu_kv(solutions: list) -> list:
    """`solutions` less those that keep the KV cache in RAM beside GPU layers, where one with it on the GPU fits:
    attention then runs on the CPU without flash attention, a prompt's quadratic in its length (l70 at 8 GiB: a
    2048-token prompt in 30 s, 2.5 s with the cache on the GPU; one server client 0.90x of the CLI's plan,
    bench/RESULTS.md prefill-house, serve-one-client-h100), as llama.cpp never places it."""
    on_gpu = any(s.kv_tier == GPU for s in solutions)
    return [s for s in solutions if s.kv_tier == GPU or not (on_gpu and s.memory[GPU]["compute"] > 0)]


def choose(solutions: list):
    """The kept one of `solutions` (solve.Solution: `streams`, `turn_s`, `prediction`, `at`), with its `why`."""
    solutions = beside_gpu_kv(solutions)
    best = min(solutions, key=lambda s: s.turn_s)  # min() keeps the first of equals
    if not best.streams:
        rival = min((s for s in solutions if s.streams), key=lambda s: s.turn_s, default=None)
        return best if rival is None else dataclasses.replace(
            best, why=f"llama.cpp's kind of placement (nothing streamed): predicts {best.prediction.decode_tok_s:.2f} "
                      f"tok/s decode, the best streaming plan {rival.prediction.decode_tok_s:.2f}")
    plain = min((s for s in solutions if not s.streams), key=lambda s: s.turn_s, default=None)
    if plain is None:
        return best
    # a plan for several sequences counts its aggregate decode too (its turn weighs the one sequence's most), at its
    # own step and the fewer sequences it runs as clients come and go: below op offload's batch, llama.cpp's kind
    # computes every RAM weight on the CPU, however fast its own step
    many = best.prediction.parallel
    gains = [(plain.turn_s / best.turn_s - 1, "a chat turn", plain.prediction.decode_tok_s)]
    if many > 1:
        gains.append((best.prediction.decode_tok_s / plain.prediction.decode_tok_s - 1, f"{many} sequences' decode",
                      plain.prediction.decode_tok_s))
    if many >= knobs.OP_OFFLOAD_MIN_BATCH and best.at is not None and plain.at is not None:  # its own step has
        for k in (knobs.OP_OFFLOAD_MIN_BATCH // 2, knobs.OP_OFFLOAD_MIN_BATCH - 1):  # op offload, fewer do not
            b, p = best.at(k).decode_tok_s, plain.at(k).decode_tok_s
            gains.append((b / p - 1, f"{k} sequences' decode", p))
    gain, what, theirs = max(gains, key=lambda g: g[0])
    if gain < knobs.STREAM_GAIN_MIN:
        return dataclasses.replace(plain, why=f"llama.cpp's kind of placement (nothing streamed): the best streaming "
                                              f"plan predicts only {gain:.0%} faster, within the cost model's error "
                                              f"({knobs.STREAM_GAIN_MIN:.0%})")
    return dataclasses.replace(best, why=f"streaming predicts {gain:.0%} faster than llama.cpp's kind of placement "
                                         f"({what}: {theirs:.2f} tok/s there)")

__all__ = ["beside_gpu_kv", "choose"]
