"""Hyper-parameters checked as llama_model_base::load_hparams asserts on them (src/llama-model.cpp).

load_hparams runs for every architecture before its own load_arch_hparams, and aborts the
process (GGML_ASSERT) on a block count, expert count or rope scaling type out of range: those
conditions are restated here in its order, with its limits. A few that abort later, in the first
graph a context builds, are checked too: epsilons (ggml-cpu ops.cpp: GGML_ASSERT(eps >= 0.0f)),
rope dimensions (ggml-cpu ops.cpp rope: n_dims <= ne0, even) and grouped-query head counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import gguf

from hypura.modelfile.arch_rules import HEAD_K_IS_V, NEEDS_EXPERTS, NEEDS_EXPERTS_PAST_DENSE_LEAD, ROT_IS_HEAD
from hypura.modelfile.metadata import Meta
from hypura.modelfile.problems import Invalid

V = gguf.GGUFValueType

LLAMA_MAX_LAYERS = 512  # src/llama-hparams.h
LLAMA_MAX_EXPERTS = 1024  # src/llama-hparams.h
INT32_MAX = 2**31 - 1  # llama.h: llama_model_n_ctx_train returns int32_t
# src/llama-model.cpp LLAMA_ROPE_SCALING_TYPES: any other name fails GGML_ASSERT(... != UNSPECIFIED)
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")
# load_hparams: these architectures throw "invalid n_rot" unless n_rot equals the head size
_ROT_IS_HEAD = ("llama", "deci", "falcon", "llama-embed")
# load_hparams: these drop a single expert (n_expert <= 1 means dense)
_DENSE_BELOW_TWO_EXPERTS = ("hunyuan_vl", "hunyuan-dense")
_SWA_HEAD_KEYS = ("%s.attention.key_length_swa", "%s.attention.value_length_swa", "%s.rope.dimension_count_swa")
_EPSILONS = ("%s.attention.layer_norm_epsilon", "%s.attention.layer_norm_rms_epsilon")


@dataclass(frozen=True)
class HParams:
    """What later checks need of the hyper-parameters, as llama.cpp derives them."""

    n_layer: int
    n_embd: int
    n_expert: int
    n_expert_used: tuple[int, ...]  # per layer
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    n_embd_head_k: int
    n_rot: int
    n_ff: tuple[int, ...] = ()  # per layer, feed_forward_length


def check_hparams(meta: Meta, vocab_only: bool = False) -> HParams:
    n_ctx_train = meta.u32("%s.context_length", required=True)
    if not 1 <= n_ctx_train <= INT32_MAX:
        raise Invalid(meta.key("%s.context_length"), n_ctx_train, f"1..{INT32_MAX} (llama_model_n_ctx_train is int32)")
    n_embd = meta.u32("%s.embedding_length", required=True)
    if n_embd < 1:
        raise Invalid(meta.key("%s.embedding_length"), n_embd, "at least 1")
    n_layer = meta.u32("%s.block_count", required=True)
    if not 1 <= n_layer <= LLAMA_MAX_LAYERS:
        raise Invalid(meta.key("%s.block_count"), n_layer, f"1..{LLAMA_MAX_LAYERS} (llama-hparams.h LLAMA_MAX_LAYERS)")
    n_nextn = meta.u32("%s.nextn_predict_layers", 0)
    if n_nextn > n_layer:
        raise Invalid(meta.key("%s.nextn_predict_layers"), n_nextn, f"at most block_count ({n_layer})")
    if not vocab_only and not meta.scalar("%s.attention.causal", V.BOOL, True):
        # llama-context.cpp decode: GGML_ASSERT(causal_attn || n_ubatch >= n_tokens) on a longer prompt
        raise Invalid(meta.key("%s.attention.causal"), False,
                      "true for text generation (llama.cpp aborts non-causal models on prompts longer than a micro-batch)")
    n_expert, used = _experts(meta, n_layer)
    n_head = meta.per_layer("%s.attention.head_count", n_layer)
    n_head_kv = meta.per_layer("%s.attention.head_count_kv", n_layer, default=-1)
    n_head_kv = [h if kv == -1 else kv for h, kv in zip(n_head, n_head_kv)]  # n_head_kv defaults to n_head
    n_ff = meta.per_layer("%s.feed_forward_length", n_layer)
    meta.per_layer("%s.expert_feed_forward_length", n_layer)
    _rope_scaling(meta)
    for key in _EPSILONS:
        eps = meta.f32(key)
        if eps is not None and not (math.isfinite(eps) and eps >= 0.0):
            raise Invalid(meta.key(key), eps, "a finite epsilon >= 0 (ggml-cpu norm: GGML_ASSERT(eps >= 0.0f))")
    head_k, n_rot = _head_dims(meta, n_embd, n_head[0])
    _check_heads(meta, n_head, n_head_kv)
    return HParams(n_layer, n_embd, n_expert, tuple(used), tuple(n_head), tuple(n_head_kv), head_k, n_rot,
                   tuple(n_ff))


def _experts(meta: Meta, n_layer: int) -> tuple[int, list[int]]:
    n_expert = meta.u32("%s.expert_count", 0)
    used = meta.per_layer("%s.expert_used_count", n_layer)
    groups = meta.u32("%s.expert_group_count", 0)
    group_used = meta.u32("%s.expert_group_used_count", 0)
    if meta.arch in _DENSE_BELOW_TWO_EXPERTS and n_expert <= 1:
        n_expert, used = 0, [0] * n_layer
    used_max = max(used)
    expert_count, used_key = meta.key("%s.expert_count"), meta.key("%s.expert_used_count")
    if n_expert > LLAMA_MAX_EXPERTS:
        raise Invalid(expert_count, n_expert, f"at most {LLAMA_MAX_EXPERTS} (llama-hparams.h LLAMA_MAX_EXPERTS)")
    if used_max > n_expert:
        raise Invalid(used_key, used_max, f"at most expert_count ({n_expert})")
    groups_key = meta.key("%s.expert_group_count")
    if n_expert > 0:
        if used_max == 0:
            raise Invalid(used_key, used_max, f"at least 1 with {n_expert} experts")
        if groups >= n_expert:
            raise Invalid(groups_key, groups, f"fewer than expert_count ({n_expert})")
        if groups > 1:
            if n_expert % groups:
                raise Invalid(groups_key, groups, f"a divisor of expert_count ({n_expert})")
            if not 0 < group_used < groups:
                raise Invalid(meta.key("%s.expert_group_used_count"), group_used, f"1..{groups - 1}")
    elif used_max or groups:
        raise Invalid(used_key if used_max else groups_key, used_max or groups, "0 without experts")
    dense_lead = meta.u32("%s.leading_dense_block_count", 0)
    if not n_expert and (meta.arch in NEEDS_EXPERTS or (meta.arch in NEEDS_EXPERTS_PAST_DENSE_LEAD and
                                                        dense_lead < n_layer)):
        raise Invalid(expert_count, n_expert, f"at least 1 for {meta.arch} (its loader asserts n_expert > 0)")
    return n_expert, used


def _rope_scaling(meta: Meta) -> None:
    scaling = meta.scalar("%s.rope.scaling.type", V.STRING, "linear")
    if scaling not in ROPE_SCALING_TYPES:
        raise Invalid(meta.key("%s.rope.scaling.type"), scaling, "one of " + ", ".join(ROPE_SCALING_TYPES))
    for key in ("%s.rope.freq_base", "%s.rope.scaling.factor", "%s.rope.scale_linear",
                "%s.rope.scaling.attn_factor", "%s.rope.scaling.alpha"):
        value = meta.f32(key)
        if value is not None and not math.isfinite(value):
            raise Invalid(meta.key(key), value, "a finite number")
    meta.u32("%s.rope.scaling.original_context_length")
    meta.scalar("%s.rope.scaling.finetuned", V.BOOL)


def _head_dims(meta: Meta, n_embd: int, n_head: int) -> tuple[int, int]:
    """(n_embd_head_k, n_rot) as load_hparams derives them; (0, 0) without attention heads."""
    if n_head == 0:
        return 0, 0
    head_k = meta.u32("%s.attention.key_length", n_embd // n_head)
    head_v = meta.u32("%s.attention.value_length", n_embd // n_head)
    n_rot = meta.u32("%s.rope.dimension_count", head_k)
    rot_key = meta.key("%s.rope.dimension_count")
    if meta.arch in _ROT_IS_HEAD and n_rot != head_k:
        raise Invalid(rot_key, n_rot, f"the head size {head_k} for {meta.arch} (load_hparams: invalid n_rot)")
    if n_rot % 2 or n_rot > head_k:
        raise Invalid(rot_key, n_rot, f"an even number up to the head size {head_k} (ggml rope)")
    if not any(meta.find(k) for k in _SWA_HEAD_KEYS):  # layer 0 may be a sliding-window one, sized apart
        if meta.arch in ROT_IS_HEAD | HEAD_K_IS_V and head_v != head_k:
            raise Invalid(meta.key("%s.attention.value_length"), head_v,
                          f"the key length {head_k} ({meta.arch}'s graph asserts it)")
        if meta.arch in ROT_IS_HEAD and n_rot != head_v:
            raise Invalid(rot_key, n_rot, f"the head size {head_v} ({meta.arch}'s graph asserts it)")
    return head_k, n_rot


def _check_heads(meta: Meta, n_head: list[int], n_head_kv: list[int]) -> None:
    """Grouped-query attention broadcasts K and V heads over query heads: ggml_mul_mat asserts the
    count of one divides the other's."""
    for il, (h, kv) in enumerate(zip(n_head, n_head_kv)):
        if kv > h or (kv and h % kv):
            where = "" if len(set(n_head_kv)) == 1 and len(set(n_head)) == 1 else f" (layer {il})"
            raise Invalid(meta.key("%s.attention.head_count_kv") + where, kv,
                          f"a divisor of attention.head_count ({h})")
