"""The tensors of a model shape: names, shapes and what kind of data each holds, in the order
`llama-quantize` writes them (non-layer tensors first, then each block, names sorted within)."""

from __future__ import annotations

from collections.abc import Callable
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
    D, V = s.n_embd, s.n_vocab
    specs = [
        TensorSpec(_name(T.TOKEN_EMBD), (V, D), WEIGHT),
        TensorSpec(_name(T.OUTPUT_NORM), (D,), NORM),
        TensorSpec(_name(T.OUTPUT), (V, D), WEIGHT),
    ]
    if s.llama3_rope:
        specs.append(TensorSpec(_name(T.ROPE_FREQS), (s.n_embd_head // 2,), ROPE_FREQS))

    for i in range(s.n_layer):
        def add(tensor: T, shape: tuple[int, ...], kind: str, suffix: str = "weight") -> None:
            specs.append(TensorSpec(_name(tensor, suffix, i), shape, kind, i))

        add(T.ATTN_NORM, (D,), NORM)
        (_mla if s.mla else _attention)(s, add)
        add(T.ATTN_POST_NORM if s.post_attn_norm else T.FFN_NORM, (D,), NORM)
        (_moe if s.is_moe_layer(i) else _dense_ffn)(s, add)

    _check_arch(s.arch, specs)
    # llama_model_loader's weight_name_comparer: by block (-1 first), then by name
    return sorted(specs, key=lambda t: (t.layer, t.name))


Add = Callable[..., None]


def _attention(s: ModelShape, add: Add) -> None:
    D, Q, KV, H = s.n_embd, s.n_embd_q, s.n_embd_kv, s.n_embd_head
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
    if s.proj_bias:
        add(T.ATTN_OUT, (D,), BIAS, "bias")
    if s.attn_sinks:
        add(T.ATTN_SINKS, (s.n_head,), BIAS)  # one F32 logit per head


def _mla(s: ModelShape, add: Add) -> None:
    """llama_model_deepseek2::load_arch_tensors with q_lora_rank > 0 and split k_b/v_b."""
    m, D, N = s.mla, s.n_embd, s.n_head
    assert m is not None
    add(T.ATTN_Q_A_NORM, (m.q_lora_rank,), NORM)
    add(T.ATTN_KV_A_NORM, (m.kv_lora_rank,), NORM)
    add(T.ATTN_Q_A, (m.q_lora_rank, D), WEIGHT)
    add(T.ATTN_Q_B, (N * (m.qk_nope_head_dim + m.qk_rope_head_dim), m.q_lora_rank), WEIGHT)
    add(T.ATTN_KV_A_MQA, (m.kv_lora_rank + m.qk_rope_head_dim, D), WEIGHT)
    add(T.ATTN_K_B, (N, m.kv_lora_rank, m.qk_nope_head_dim), WEIGHT)
    add(T.ATTN_V_B, (N, m.v_head_dim, m.kv_lora_rank), WEIGHT)
    add(T.ATTN_OUT, (D, N * m.v_head_dim), WEIGHT)


def _dense_ffn(s: ModelShape, add: Add) -> None:
    D, F = s.n_embd, s.n_ff
    add(T.FFN_GATE, (F, D), WEIGHT)
    add(T.FFN_UP, (F, D), WEIGHT)
    add(T.FFN_DOWN, (D, F), WEIGHT)


def _moe(s: ModelShape, add: Add) -> None:
    # stacked experts: one expert is a contiguous byte range of each tensor
    D, E, Fe = s.n_embd, s.n_expert, s.expert_ff
    add(T.FFN_GATE_INP, (E, D), ROUTER)
    if s.router and s.router.probs_bias:
        add(T.FFN_EXP_PROBS_B, (E,), BIAS, "bias")
    add(T.FFN_GATE_EXP, (E, Fe, D), WEIGHT)
    add(T.FFN_UP_EXP, (E, Fe, D), WEIGHT)
    add(T.FFN_DOWN_EXP, (E, D, Fe), WEIGHT)
    if s.proj_bias:
        add(T.FFN_GATE_INP, (E,), BIAS, "bias")
        add(T.FFN_GATE_EXP, (E, Fe), BIAS, "bias")
        add(T.FFN_UP_EXP, (E, Fe), BIAS, "bias")
        add(T.FFN_DOWN_EXP, (E, D), BIAS, "bias")
    if s.n_expert_shared:
        Fs = Fe * s.n_expert_shared
        add(T.FFN_GATE_SHEXP, (Fs, D), WEIGHT)
        add(T.FFN_UP_SHEXP, (Fs, D), WEIGHT)
        add(T.FFN_DOWN_SHEXP, (D, Fs), WEIGHT)


def _check_arch(arch: str, specs: list[TensorSpec]) -> None:
    """Every tensor must be one llama.cpp knows for this architecture (gguf-py's table)."""
    arch_enum = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch)
    known = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[arch_enum]}
    for spec in specs:
        base = spec.name.rsplit(".", 1)[0]
        if spec.layer >= 0:
            base = base.replace(f"blk.{spec.layer}.", "blk.{bid}.", 1)
        assert base in known, f"{spec.name} is not a {arch} tensor"
