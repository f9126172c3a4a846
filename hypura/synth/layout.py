"""The tensors of a model shape: names, shapes and what kind of data each holds, in the order
`llama-quantize` writes them (non-layer tensors first, then each block, names sorted within)."""

from __future__ import annotations

from dataclasses import dataclass

import gguf
from gguf import MODEL_TENSOR as T

from hypura.synth.shapes import ModelShape

# data kinds: each has a producer in writer.py
WEIGHT = "weight"  # a matrix or stacked experts; quantized per quant_mix
NORM = "norm"  # RMS norm weight, F32
BIAS = "bias"  # F32
ROUTER = "router"  # MoE gate (ffn_gate_inp), kept F32 by llama.cpp's quantizer
ROPE_FREQS = "rope_freqs"  # llama3 rope scaling factors, F32


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # numpy order, outermost first; GGUF's ne[] is this reversed
    kind: str
    layer: int = -1  # -1: not in a block

    @property
    def ne0(self) -> int:
        """Row length: quant blocks run along it."""
        return self.shape[-1]

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def _name(tensor: T, suffix: str = "weight", bid: int | None = None) -> str:
    return f"{gguf.TENSOR_NAMES[tensor].format(bid=bid)}.{suffix}"


def tensor_specs(s: ModelShape) -> list[TensorSpec]:
    D, V, F, E = s.n_embd, s.n_vocab, s.n_ff, s.n_expert
    Q, KV, H = s.n_embd_q, s.n_embd_kv, s.n_embd_head
    specs = [
        TensorSpec(_name(T.TOKEN_EMBD), (V, D), WEIGHT),
        TensorSpec(_name(T.OUTPUT_NORM), (D,), NORM),
        TensorSpec(_name(T.OUTPUT), (V, D), WEIGHT),
    ]
    if s.llama3_rope:
        specs.append(TensorSpec(_name(T.ROPE_FREQS), (H // 2,), ROPE_FREQS))

    for i in range(s.n_layer):
        def add(tensor: T, shape: tuple[int, ...], kind: str, suffix: str = "weight") -> None:
            specs.append(TensorSpec(_name(tensor, suffix, i), shape, kind, i))

        add(T.ATTN_NORM, (D,), NORM)
        add(T.ATTN_Q, (Q, D), WEIGHT)
        add(T.ATTN_K, (KV, D), WEIGHT)
        add(T.ATTN_V, (KV, D), WEIGHT)
        add(T.ATTN_OUT, (D, Q), WEIGHT)
        if s.qkv_bias:
            add(T.ATTN_Q, (Q,), BIAS, "bias")
            add(T.ATTN_K, (KV,), BIAS, "bias")
            add(T.ATTN_V, (KV,), BIAS, "bias")
        if s.qk_norm:
            add(T.ATTN_Q_NORM, (H,), NORM)
            add(T.ATTN_K_NORM, (H,), NORM)
        add(T.FFN_NORM, (D,), NORM)
        if E:
            # stacked experts: one expert is a contiguous byte range of each tensor
            Fe = s.expert_ff
            add(T.FFN_GATE_INP, (E, D), ROUTER)
            add(T.FFN_GATE_EXP, (E, Fe, D), WEIGHT)
            add(T.FFN_UP_EXP, (E, Fe, D), WEIGHT)
            add(T.FFN_DOWN_EXP, (E, D, Fe), WEIGHT)
        else:
            add(T.FFN_GATE, (F, D), WEIGHT)
            add(T.FFN_UP, (F, D), WEIGHT)
            add(T.FFN_DOWN, (D, F), WEIGHT)

    _check_arch(s.arch, specs)
    # llama_model_loader's weight_name_comparer: by block (-1 first), then by name
    return sorted(specs, key=lambda t: (t.layer, t.name))


def _check_arch(arch: str, specs: list[TensorSpec]) -> None:
    """Every tensor must be one llama.cpp knows for this architecture (gguf-py's table)."""
    arch_enum = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch)
    known = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[arch_enum]}
    for spec in specs:
        base = spec.name.rsplit(".", 1)[0]
        if spec.layer >= 0:
            base = base.replace(f"blk.{spec.layer}.", "blk.{bid}.", 1)
        assert base in known, f"{spec.name} is not a {arch} tensor"
