"""Tensor checks: each tensor's type fits the op llama.cpp computes with it, its bytes lie in the
file where the backends can use them, and the tensors every llama-style block needs have the
shapes llama.cpp's loader will ask for.

A norm retyped F32 -> I32 keeps its byte size, so llama.cpp loads it and aborts at the first decode
(ggml-cpu binary_op: unsupported types); a router retyped so segfaults in the CPU matmul. Mapped
tensors must start at multiples of ggml's TENSOR_ALIGNMENT, or ggml-backend asserts ("buffer
pointer must be aligned") when it wraps the mapping.
"""

from __future__ import annotations

import re

from hypura.modelfile.ggml_types import ELEMENTWISE_TYPES, MATMUL_TYPES, TRAITS, GGMLType
from hypura.modelfile.hparams import HParams
from hypura.modelfile.problems import Invalid, Name, Truncated, shown
from hypura.modelfile.reader import RawFile, RawTensor
from hypura.modelfile.tensor_roles import ELEMENTWISE, MATMUL

TENSOR_ALIGNMENT = 32  # ggml/src/ggml-impl.h: ggml-backend's CPU buffers need data at multiples of it
# architectures whose blocks are llama's (llama.cpp src/models/{llama,qwen2,qwen3,qwen3moe,...}.cpp
# load_arch_tensors): every block has these norms of n_embd, the embedding is n_embd x n_vocab
LLAMA_STYLE = ("llama", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "mistral3", "smollm3", "granite", "granitemoe")


def _pattern(templates: tuple[str, ...]) -> re.Pattern:
    parts = (re.escape(t).replace("%d", r"\d+") for t in templates)
    return re.compile(r"^(?:" + "|".join(parts) + r")\.(weight|bias)$")


_ELEMENTWISE, _MATMUL = _pattern(ELEMENTWISE), _pattern(MATMUL)


def allowed_types(name: str):
    """The ggml types llama.cpp can compute with for tensor `name`; None where it is not checked."""
    m = _ELEMENTWISE.match(name)
    if m or (name.endswith(".bias") and _MATMUL.match(name)):
        return ELEMENTWISE_TYPES, "f32 (an element-wise weight: ggml-cpu's binary ops take f32)"
    if _MATMUL.match(name):
        return MATMUL_TYPES, "a float or quantized type with a dot product (a matmul weight)"
    return None


def check_tensors(raw: RawFile, file_size: int) -> None:
    if not raw.tensors:
        raise Invalid("tensor count", 0, "at least one tensor")
    for t in raw.tensors:
        start = raw.data_offset + t.offset
        end = start + t.nbytes
        if end > file_size:
            raise Truncated(f"tensor '{t.name}'", f"ends at byte {end} past the end of the file ({file_size} bytes)")
        if start % TENSOR_ALIGNMENT:
            raise Invalid("general.alignment", raw.alignment,
                          f"a multiple of {TENSOR_ALIGNMENT} (tensor {shown(t.name)} would start at byte {start}, "
                          f"which ggml-backend cannot map)")
        _check_type(t)


def _check_type(t: RawTensor) -> None:
    allowed = allowed_types(t.name)
    if allowed is None:
        return
    types, expected = allowed
    if t.ggml_type not in types:
        raise Invalid(f"tensor '{t.name}' type", Name(TRAITS[GGMLType(t.ggml_type)].name), expected)


def check_block_shapes(raw: RawFile, arch: str, hp: HParams, n_vocab: int) -> None:
    """The norms and embedding of a llama-style model, as its load_arch_tensors creates them."""
    if arch not in LLAMA_STYLE:
        return
    by_name = {t.name: t for t in raw.tensors}
    expected = {"token_embd.weight": (hp.n_embd, n_vocab), "output_norm.weight": (hp.n_embd,)}
    for il in range(hp.n_layer):
        expected[f"blk.{il}.attn_norm.weight"] = (hp.n_embd,)
        expected[f"blk.{il}.ffn_norm.weight"] = (hp.n_embd,)
        if hp.n_expert:
            expected[f"blk.{il}.ffn_gate_inp.weight"] = (hp.n_embd, hp.n_expert)
    for name, shape in expected.items():
        t = by_name.get(name)
        if t is None:
            raise Invalid(f"tensor '{name}'", Name("missing"), f"a tensor of shape {list(shape)} ({arch} needs it)")
        if _padded(t.ne) != _padded(shape):
            raise Invalid(f"tensor '{name}' shape", list(t.ne), f"{list(shape)} (from the {arch} hyper-parameters)")
    if not hp.n_expert:  # a dense block's FFN is n_embd x feed_forward_length (the planner sizes buffers by it)
        for il, n_ff in enumerate(hp.n_ff):
            t = by_name.get(f"blk.{il}.ffn_up.weight")
            if t is not None and n_ff and _padded(t.ne) != _padded((hp.n_embd, n_ff)):
                raise Invalid(f"tensor '{t.name}' shape", list(t.ne),
                              f"{[hp.n_embd, n_ff]} (from {arch}.embedding_length and {arch}.feed_forward_length)")


def _padded(ne) -> tuple[int, ...]:
    """A shape as ggml holds it: four dimensions, the missing ones 1."""
    return tuple(ne) + (1,) * (4 - len(ne))
