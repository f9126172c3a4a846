"""Which ggml type each tensor gets for a file type: the choice llama.cpp's quantizer makes.

A transcription of `llama_tensor_get_type` / `llama_tensor_get_type_impl` /
`tensor_type_fallback` / `tensor_allows_quantization` in src/llama-quant.cpp (llama.cpp as
vendored by llama-cpp-python 0.3.36), restricted to the file types `hypura synth` writes and
the tensors of its shapes (no imatrix, no overrides, no Falcon). The rules are evaluated on
the file as written: with `--layers N` the quantizer would see N blocks, so `use_more_bits`
runs over N and the 70B attn_v bump (which llama.cpp keys on n_layer == 80) does not apply.
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf
from gguf import GGMLQuantizationType as Q
from gguf import LlamaFileType

from hypura.errors import HypuraError
from hypura.synth.layout import WEIGHT, TensorSpec
from hypura.synth.shapes import ModelShape


@dataclass(frozen=True)
class FileType:
    name: str  # --ftype spelling
    ftype: LlamaFileType  # general.file_type
    default: Q  # llama_ftype_get_default_type


FTYPES: dict[str, FileType] = {f.name: f for f in [
    FileType("q4_k_m", LlamaFileType.MOSTLY_Q4_K_M, Q.Q4_K),
    FileType("q5_k_m", LlamaFileType.MOSTLY_Q5_K_M, Q.Q5_K),
    FileType("q8_0", LlamaFileType.MOSTLY_Q8_0, Q.Q8_0),
    FileType("f16", LlamaFileType.MOSTLY_F16, Q.F16),
    FileType("mxfp4_moe", LlamaFileType.MOSTLY_MXFP4_MOE, Q.MXFP4),  # gpt-oss as released
]}

_NOT_QUANTIZED = (Q.F32, Q.F16, Q.BF16)

# tensor_type_fallback: a 256-block K-quant whose row length isn't a multiple of 256
_FALLBACK = {Q.Q2_K: Q.Q4_0, Q.Q3_K: Q.Q4_0, Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}


def get_ftype(name: str) -> FileType:
    try:
        return FTYPES[name.lower()]
    except KeyError:
        raise HypuraError(f"unknown --ftype {name!r}; known: {', '.join(FTYPES)}") from None


def block_size(t: Q) -> int:
    return gguf.GGML_QUANT_SIZES[t][0]


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """The *_K_M mixes give these layers' attn_v and ffn_down more bits: first and last eighth,
    and every third layer in between."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def category(name: str) -> str:
    """tensor_get_category: broad roles by name (first match wins, as in llama.cpp)."""
    if name == "output.weight":
        return "output"
    if name == "token_embd.weight":
        return "token_embd"
    for cat in ("attn_qkv.weight", "attn_kv_b.weight", "attn_v.weight", "attn_k.weight",
                "attn_q.weight", "attn_output.weight", "ffn_up", "ffn_gate", "ffn_down"):
        if cat in name:
            return cat.removesuffix(".weight")
    return "other"


def allows_quantization(spec: TensorSpec) -> bool:
    """tensor_allows_quantization, for the tensors our shapes have: matrices ending in
    `weight`, except norms and the MoE router."""
    return (len(spec.shape) >= 2 and spec.name.endswith("weight") and "_norm.weight" not in spec.name
            and "ffn_gate_inp.weight" not in spec.name)


def source_type(spec: TensorSpec) -> Q:
    """Type in the f16 GGUF that convert_hf_to_gguf writes: 1-D tensors and the router stay F32."""
    return Q.F16 if spec.kind == WEIGHT else Q.F32


def tensor_types(specs: list[TensorSpec], shape: ModelShape, ftype: FileType) -> list[Q]:
    """The ggml type of each tensor (same order as `specs`, which must be llama-quantize's order:
    the attn_v counter below relies on it)."""
    names = [s.name for s in specs]
    st = _State(
        n_layer=shape.n_layer,
        n_expert=shape.n_expert,
        n_attention_wv=sum(category(n) in ("attn_v", "attn_qkv", "attn_kv_b") for n in names),
        tied_embeddings="output.weight" not in names,
        # llama_model_llama::load_arch_hparams: LLM_TYPE_70B is 80 blocks with GQA and no experts
        is_70b=shape.arch == "llama" and shape.n_layer == 80 and shape.n_head != shape.n_head_kv
        and shape.n_expert != 8,
    )
    out = []
    for spec in specs:
        if not allows_quantization(spec):
            out.append(source_type(spec))
            continue
        t = ftype.default
        if t not in _NOT_QUANTIZED:
            t = _choose(st, spec, ftype, t)
            t = _fallback(t, spec.ne0)
        out.append(t)
    return out


@dataclass
class _State:
    n_layer: int
    n_expert: int
    n_attention_wv: int
    tied_embeddings: bool
    is_70b: bool
    i_attention_wv: int = 0
    i_ffn_down: int = 0


def _choose(st: _State, spec: TensorSpec, ftype: FileType, t: Q) -> Q:
    """llama_tensor_get_type_impl for Q4_K_M / Q5_K_M / Q8_0 / MXFP4_MOE."""
    cat = category(spec.name)
    k_m = ftype.ftype in (LlamaFileType.MOSTLY_Q4_K_M, LlamaFileType.MOSTLY_Q5_K_M)
    if ftype.ftype == LlamaFileType.MOSTLY_MXFP4_MOE:
        # stacked (3-D) tensors MXFP4, everything else Q8_0, the output head included
        return Q.MXFP4 if len(spec.shape) == 3 and cat != "output" else Q.Q8_0

    if cat == "output" or (st.tied_embeddings and cat == "token_embd"):
        if spec.ne0 % block_size(t) != 0:
            return Q.Q8_0
        return t if t == Q.Q8_0 else Q.Q6_K
    if cat == "token_embd":
        return t  # only the IQ/TQ mixes change it
    if cat in ("attn_v", "attn_qkv", "attn_kv_b"):
        if k_m and use_more_bits(st.i_attention_wv, st.n_attention_wv):
            t = Q.Q6_K
        if st.is_70b and t in (Q.Q3_K, Q.Q4_K):
            t = Q.Q5_K  # 70B: attn_v is 8x smaller than attn_q, more bits are cheap
        if st.n_expert == 8:
            t = Q.Q8_0  # 8-expert models (Mixtral): "trades just ~128MB"
        st.i_attention_wv += 1
        return t
    if cat == "attn_k":
        return Q.Q8_0 if st.n_expert == 8 else t
    if cat == "ffn_down":
        # MoE: the block index comes from the name; dense: a counter (one ffn_down per block)
        i_layer = spec.layer if st.n_expert > 1 else st.i_ffn_down
        st.i_ffn_down += 1
        return Q.Q6_K if k_m and use_more_bits(i_layer, st.n_layer) else t
    if cat == "attn_output":
        if st.n_expert == 8 and ftype.ftype == LlamaFileType.MOSTLY_Q4_K_M:
            return Q.Q5_K
        return t
    return t  # attn_q, ffn_gate, ffn_up: the default type for these mixes


def _fallback(t: Q, ne0: int) -> Q:
    """tensor_type_fallback: rows must hold whole blocks; else a 32-block type, else F16."""
    if ne0 % block_size(t) == 0:
        return t
    t = _FALLBACK.get(t, t)
    return t if ne0 % block_size(t) == 0 else Q.F16
