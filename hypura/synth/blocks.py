"""Random but valid weight bytes, fast: a pool of random quant blocks per ggml type, written
out as slices that start at random block offsets, so generating bytes never limits the write.
Each slice is made its own (its integer fields XORed with a random pattern, float weights scaled): two
slices of one pool would otherwise repeat whole rows, and a repeated output row ties two tokens' logits
exactly, which front ends break differently (llama-cpp-python took the lower id, llama-completion the other).

A block's integer fields (quants, 6-bit sub-block scales) are random bytes: every bit pattern
is valid. Its fp16 scales are set to small finite values chosen so the dequantized weights
have mean ~0 and standard deviation ~TARGET_STD, like a trained transformer's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

TARGET_STD = 0.02  # typical init / trained weight scale of transformer matrices
POOL_BYTES = 8 << 20  # per type; one write is at most this much (the pool holds twice it)


@dataclass(frozen=True)
class BlockScales:
    """Where a block's fp16 scales sit (ggml-common.h block_* structs) and their values.
    `d` makes std ~ TARGET_STD; `m` (the min/offset, per unit of d) cancels the mean of
    unsigned quants: w = d*q + m (Q4_1/Q5_1) or w = d*sc*q - dmin*mn (Q4_K/Q5_K)."""

    d_at: int
    d: float
    m_at: int = -1
    m_per_d: float = 0.0


# d ~= TARGET_STD / std(integer part); the integer parts are uniform random:
#   Q8_0 q in [-128,127]: std 73.9; Q5_0 q-16: 9.2; Q4_0 q-8: 4.6;
#   Q6_K sc*(q-32), sc int8, q 6-bit: ~1365; Q4_K/Q5_K sc*q - (dmin/d)*mn with 6-bit sc, mn
#   and 4/5-bit q: ~245 / ~527 once dmin = E[sc*q]/E[mn] * d = 7.5d / 15.5d cancels the mean.
SCALES: dict[Q, BlockScales] = {
    Q.Q4_0: BlockScales(0, 4.3e-3),
    Q.Q4_1: BlockScales(0, 4.3e-3, 2, -7.5),
    Q.Q5_0: BlockScales(0, 2.2e-3),
    Q.Q5_1: BlockScales(0, 2.2e-3, 2, -15.5),
    Q.Q8_0: BlockScales(0, 2.7e-4),
    Q.Q4_K: BlockScales(0, 8.2e-5, 2, 7.5),
    Q.Q5_K: BlockScales(0, 3.8e-5, 2, 15.5),
    Q.Q6_K: BlockScales(208, 1.5e-5),  # d sits after ql[128], qh[64], scales[16]
}


def random_blocks(qtype: Q, n_blocks: int, rng: np.random.Generator, std: float = TARGET_STD) -> np.ndarray:
    """`n_blocks` random valid blocks of `qtype` whose weights have standard deviation ~`std`, as a
    flat uint8 array."""
    if qtype in (Q.F16, Q.F32):
        dtype = np.float16 if qtype == Q.F16 else np.float32
        return rng.normal(0.0, std, n_blocks).astype(dtype).view(np.uint8)
    if qtype == Q.MXFP4:
        return _mxfp4_blocks(n_blocks, rng, std)
    try:
        sc = SCALES[qtype]
    except KeyError:
        raise NotImplementedError(f"no random block layout for {qtype.name}") from None
    block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
    blocks = np.frombuffer(rng.bytes(n_blocks * block_bytes), np.uint8).reshape(n_blocks, block_bytes).copy()
    # per-block jitter so blocks differ in scale, as real ones do
    d = sc.d * (std / TARGET_STD) * rng.uniform(0.5, 1.5, n_blocks)
    blocks[:, sc.d_at:sc.d_at + 2] = d.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    if sc.m_at >= 0:
        m = (sc.m_per_d * d).astype(np.float16)
        blocks[:, sc.m_at:sc.m_at + 2] = m.view(np.uint8).reshape(n_blocks, 2)
    return blocks.reshape(-1)


# MXFP4 (block_mxfp4: one E8M0 exponent byte, 16 bytes of 4-bit E2M1 codes): w = kvalues_mxfp4[q] * 2^(e-128);
# the 16 codes {0,1,2,3,4,6,8,12, 0,-1,...,-12} have std 5.85, so e = 128 + log2(std / 5.85)
MXFP4_CODE_STD = 5.85


def _mxfp4_blocks(n_blocks: int, rng: np.random.Generator, std: float) -> np.ndarray:
    blocks = np.frombuffer(rng.bytes(n_blocks * 17), np.uint8).reshape(n_blocks, 17).copy()
    e = 128 + np.log2(std / MXFP4_CODE_STD) + rng.uniform(-0.5, 0.5, n_blocks)  # per-block jitter
    blocks[:, 0] = np.clip(np.rint(e), 1, 254).astype(np.uint8)
    return blocks.reshape(-1)


def _free_bytes(qtype: Q, block_bytes: int) -> np.ndarray:
    """A block's bytes whose every bit pattern is valid (0xFF), its fp16 scales and MXFP4's exponent (0x00)."""
    mask = np.full(block_bytes, 0xFF, np.uint8)
    if qtype == Q.MXFP4:
        mask[0] = 0
    elif qtype in SCALES:
        sc = SCALES[qtype]
        for at in (sc.d_at, sc.m_at):
            if at >= 0:
                mask[at:at + 2] = 0
    return mask


class BlockPool:
    """2n random blocks of one type; a write takes up to n of them from a random start, made its own."""

    def __init__(self, qtype: Q, rng: np.random.Generator, pool_bytes: int = POOL_BYTES, std: float = TARGET_STD):
        self.qtype = qtype
        self.block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
        self.n_blocks = max(1, pool_bytes // self.block_bytes)
        self.data = random_blocks(qtype, 2 * self.n_blocks, rng, std)
        self.free = None if qtype in (Q.F16, Q.F32) else _free_bytes(qtype, self.block_bytes)

    def chunks(self, nbytes: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
        """Fresh arrays totalling `nbytes` (a whole number of blocks), each at most the pool size."""
        assert nbytes % self.block_bytes == 0, (nbytes, self.block_bytes)
        left = nbytes // self.block_bytes
        while left:
            n = min(left, self.n_blocks)
            start = int(rng.integers(0, self.n_blocks)) * self.block_bytes
            yield self._own(self.data[start:start + n * self.block_bytes], rng)
            left -= n

    def _own(self, blocks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if self.free is None:  # floats: scaled, so no row repeats another's (XOR could make NaNs)
            dtype = np.float16 if self.qtype == Q.F16 else np.float32
            return (blocks.view(dtype) * dtype(rng.uniform(0.9, 1.1))).astype(dtype).view(np.uint8)
        # XOR keeps a uniformly random field uniform: the weights' distribution is unchanged
        pattern = np.frombuffer(rng.bytes(self.block_bytes), np.uint8) & self.free
        return (blocks.reshape(-1, self.block_bytes) ^ pattern).reshape(-1)
