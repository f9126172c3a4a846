"""Speculation inside a generation loop that hands out one token at a time (hypura-cli's).

The loop decodes what it has, then samples one token. With a SpecDecoder, decoding the last sampled
token is a verification pass instead (the draft rides along); the pass's tokens wait in `pending`
and the loop's next samples take them in order, without decoding: all but the last are already in
the KV cache, and the last one leads the next pass. `history` mirrors the KV cache, for drafters.
"""

from __future__ import annotations

from typing import Callable


class SpecDecoder:
    def __init__(self, verifier, decode: Callable[[list[int]], bool], sample: Callable[[int], int], n_ctx: int):
        """decode(tokens): a plain llama_decode; sample(i): the target's token at the batch's output i,
        accepted into the sampler chain."""
        self.verifier, self._decode, self._sample, self.n_ctx = verifier, decode, sample, n_ctx
        self.history: list[int] = []  # the tokens in the target's KV cache, in order
        self.pending: list[int] = []  # the last pass's tokens the loop has not taken yet

    def decode(self, embd: list[int], n_past: int, generating: bool, n_remain: int) -> int:
        """Decode `embd` at n_past (a pass when it is one generated token, with n_remain tokens still to
        generate, < 0: no end); the tokens the KV cache gained, or -1 when llama_decode failed."""
        if self.pending:  # embd is a token the last pass kept
            return 0
        # a pass never fills the context: the loop's context-full check sees n_past ahead of the tokens handed out
        limit = min(n_remain if n_remain > 0 else self.n_ctx, self.n_ctx - n_past - 2)
        if generating and len(embd) == 1 and limit > 1:
            out = self.verifier.step(self.history + embd, n_past, self._sample, limit)
            if out is None:
                return -1
            self.history += embd + out[:-1]
            self.pending = out
            return len(out)
        if not self._decode(embd):
            return -1
        self.history += embd
        return len(embd)

    def take(self) -> int:
        return self.pending.pop(0)

    def forget(self, start: int, n: int) -> None:
        """The context shift removed n cells from `start` on."""
        del self.history[start: start + n]

    def describe(self) -> list[str]:
        return self.verifier.stats.describe()

    def close(self) -> None:
        self.verifier.close()
