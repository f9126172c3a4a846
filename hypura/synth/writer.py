"""Streaming GGUF writer for synthetic models.

The header (KV metadata, tensor infos) is built in memory (hypura.modelfile.writer); the data region is then
written one tensor at a time, in chunks of at most a block pool's size (blocks.py), so a
40 GB model writes with bounded memory. Each tensor's bytes come from the producer for its
kind (PRODUCERS), which is the place to change what a tensor holds (e.g. router weights that
shape expert popularity). With `sparse` the data region is left as a hole.
"""

from __future__ import annotations

import math
import os
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

from hypura.errors import HypuraError
from hypura.modelfile.writer import KV, TensorInfo, header_bytes
from hypura.synth import layout
from hypura.synth.blocks import POOL_BYTES, TARGET_STD, BlockPool
from hypura.synth.layout import TensorSpec
from hypura.synth.quant_mix import FileType, get_ftype, tensor_types
from hypura.synth.routing import RouterRows, Routing
from hypura.synth.shapes import ModelShape, get_shape
from hypura.synth.tokenizer import tokenizer_kv

ROUTER_STD = TARGET_STD  # router logits ~ N(0, sqrt(n_embd) * std) for RMS-normed inputs


@dataclass(frozen=True)
class PlannedTensor:
    spec: TensorSpec
    type: Q

    @property
    def nbytes(self) -> int:
        block, size = gguf.GGML_QUANT_SIZES[self.type]
        return self.spec.n_elements // block * size


@dataclass(frozen=True)
class SynthResult:
    path: Path
    shape: ModelShape
    ftype: FileType
    tensors: tuple[PlannedTensor, ...]
    data_offset: int  # absolute offset of the data region
    file_bytes: int
    seconds: float
    sparse: bool

    @property
    def mb_per_s(self) -> float:
        return self.file_bytes / 1e6 / max(self.seconds, 1e-9)


def plan(shape: ModelShape, ftype: FileType) -> list[PlannedTensor]:
    specs = layout.tensor_specs(shape)
    return [PlannedTensor(s, t) for s, t in zip(specs, tensor_types(specs, shape, ftype))]


# --- producers: what each kind of tensor holds -------------------------------------------

@dataclass
class SynthContext:
    """What producers share: the shape, the seed, and one block pool per ggml type."""

    shape: ModelShape
    seed: int
    largest: dict[Q, int]  # bytes of the largest tensor of each type: no pool needs more
    routing: Routing = Routing()
    pools: dict[tuple[Q, float], BlockPool] = field(default_factory=dict)
    router_rows: RouterRows | None = None

    def rng(self, *key: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, *key])

    def pool(self, t: Q, std: float = TARGET_STD) -> BlockPool:
        if (t, std) not in self.pools:
            key = (1, int(t)) if std == TARGET_STD else (4, int(t))
            self.pools[(t, std)] = BlockPool(t, self.rng(*key), min(POOL_BYTES, self.largest[t]), std)
        return self.pools[(t, std)]


Buffer = memoryview | bytes | np.ndarray
Producer = Callable[[PlannedTensor, SynthContext, np.random.Generator], Iterable[Buffer]]


# the projections that write a block's result into the residual stream (Routing.out_scale scales them)
OUTPUT_PROJECTIONS = ("attn_output.weight", "ffn_down.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight")


def _weights(t: PlannedTensor, ctx: SynthContext, rng: np.random.Generator) -> Iterable[Buffer]:
    out = t.spec.name.endswith(OUTPUT_PROJECTIONS)
    return ctx.pool(t.type, TARGET_STD * ctx.routing.out_scale if out else TARGET_STD).chunks(t.nbytes, rng)


def _norm(t: PlannedTensor, ctx: SynthContext, rng: np.random.Generator) -> Iterable[Buffer]:
    return [np.ones(t.spec.shape, np.float32)]


def _bias(t: PlannedTensor, ctx: SynthContext, rng: np.random.Generator) -> Iterable[Buffer]:
    return [rng.normal(0.0, TARGET_STD, t.spec.shape).astype(np.float32)]


def _router(t: PlannedTensor, ctx: SynthContext, rng: np.random.Generator) -> Iterable[Buffer]:
    # [n_expert, n_embd]: row e scores expert e. Random: experts are roughly equally popular.
    if ctx.routing.uniform:
        return [rng.normal(0.0, ROUTER_STD, t.spec.shape).astype(np.float32)]
    if ctx.router_rows is None:  # one for the file: layers come in order, each builds on the last
        s = ctx.shape
        ctx.router_rows = RouterRows(ctx.routing, s.n_expert, s.n_expert_used, ROUTER_STD, ctx.rng(3))
    return [ctx.router_rows.next_layer(t.spec.shape)]


def _rope_freqs(t: PlannedTensor, ctx: SynthContext, rng: np.random.Generator) -> Iterable[Buffer]:
    return [llama3_rope_factors(ctx.shape)]


PRODUCERS: dict[str, Producer] = {
    layout.WEIGHT: _weights,
    layout.NORM: _norm,
    layout.BIAS: _bias,
    layout.ROUTER: _router,
    layout.ROPE_FREQS: _rope_freqs,
}


def llama3_rope_factors(shape: ModelShape) -> np.ndarray:
    """Per-frequency divisors of Llama 3.1's rope scaling: high frequencies (wavelength under
    ctx/high_freq_factor) unscaled, low ones (over ctx/low_freq_factor) divided by `factor`,
    a smooth blend in between. llama.cpp divides theta by these (ggml_rope_ext freq_factors)."""
    r = shape.llama3_rope
    assert r is not None
    dim = shape.n_embd_head
    freqs = 1.0 / shape.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    wavelen = 2 * math.pi / freqs
    smooth = (r.original_context / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor)
    factors = 1.0 / ((1 - smooth) / r.factor + smooth)
    factors = np.where(wavelen < r.original_context / r.high_freq_factor, 1.0, factors)
    factors = np.where(wavelen > r.original_context / r.low_freq_factor, r.factor, factors)
    return factors.astype(np.float32)


# --- the file ----------------------------------------------------------------------------

ALIGNMENT = gguf.GGUF_DEFAULT_ALIGNMENT  # 32: every tensor's data offset is a multiple of it
U32, F32, STR, BOOL = (gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32,
                       gguf.GGUFValueType.STRING, gguf.GGUFValueType.BOOL)


def metadata(shape: ModelShape, ftype: FileType, seed: int, sparse: bool,
             tokenizer_from: str | os.PathLike[str] | None = None, routing: Routing = Routing()) -> list[KV]:
    """general.*, {arch}.* as llama_model_base::load_hparams and each arch's
    load_arch_hparams read them (src/llama-model.cpp, src/models/*.cpp), then tokenizer.*."""
    K, a = gguf.Keys, shape.arch
    kvs = [
        KV(K.General.ARCHITECTURE, a, STR),
        KV(K.General.TYPE, gguf.GGUFType.MODEL, STR),
        KV(K.General.NAME, f"Hypura synthetic {shape.name}", STR),
        KV(K.General.SIZE_LABEL, shape.size_label, STR),
        KV(K.General.FILE_TYPE, int(ftype.ftype), U32),
        KV(K.General.QUANTIZATION_VERSION, gguf.GGML_QUANT_VERSION, U32),
        KV("hypura.synth.shape", shape.name, STR),
        KV("hypura.synth.seed", seed, U32),
        KV("hypura.synth.n_layer_full", shape.n_layer_full or shape.n_layer, U32),
        KV("hypura.synth.sparse", sparse, BOOL),
        KV(K.LLM.CONTEXT_LENGTH.format(arch=a), shape.n_ctx, U32),
        KV(K.LLM.EMBEDDING_LENGTH.format(arch=a), shape.n_embd, U32),
        KV(K.LLM.BLOCK_COUNT.format(arch=a), shape.n_layer, U32),
        KV(K.LLM.FEED_FORWARD_LENGTH.format(arch=a), shape.n_ff, U32),
        KV(K.Attention.HEAD_COUNT.format(arch=a), shape.n_head, U32),
        KV(K.Attention.HEAD_COUNT_KV.format(arch=a), shape.n_head_kv, U32),
        KV(K.Attention.LAYERNORM_RMS_EPS.format(arch=a), shape.norm_eps, F32),
        KV(K.Rope.FREQ_BASE.format(arch=a), shape.rope_theta, F32),
    ]
    if a == "llama":  # convert_hf_to_gguf writes these for llama; llama.cpp checks n_rot == head dim
        kvs += [KV(K.LLM.VOCAB_SIZE.format(arch=a), shape.n_vocab, U32),
                KV(K.Rope.DIMENSION_COUNT.format(arch=a), shape.n_embd_head, U32)]
    if shape.head_dim:  # head dim != n_embd / n_head (qwen3)
        kvs += [KV(K.Attention.KEY_LENGTH.format(arch=a), shape.head_dim, U32),
                KV(K.Attention.VALUE_LENGTH.format(arch=a), shape.head_dim, U32)]
    kvs += _mla_kv(shape) + _yarn_kv(shape)
    if shape.n_swa:  # llama.cpp's gpt-oss loader: SWA on blocks 0, 2, 4, ... (pattern 2)
        kvs.append(KV(K.Attention.SLIDING_WINDOW.format(arch=a), shape.n_swa, U32))
    if shape.n_expert:
        kvs += [KV(K.LLM.EXPERT_COUNT.format(arch=a), shape.n_expert, U32),
                KV(K.LLM.EXPERT_USED_COUNT.format(arch=a), shape.n_expert_used, U32)]
    if shape.n_ff_exp:
        kvs.append(KV(K.LLM.EXPERT_FEED_FORWARD_LENGTH.format(arch=a), shape.n_ff_exp, U32))
    kvs += _router_kv(shape)
    if shape.n_expert:  # so that no synthetic hit rate passes for a real model's
        kvs += [KV("hypura.synth.router_skew", routing.skew, F32),
                KV("hypura.synth.router_layer_corr", routing.layer_corr, F32)]
    if routing.out_scale != 1.0:
        kvs += [KV("hypura.synth.block_out_scale", routing.out_scale, F32)]
    return kvs + tokenizer_kv(shape.n_vocab, tokenizer_from)


def _mla_kv(shape: ModelShape) -> list[KV]:
    """What convert_hf_to_gguf's DeepseekV2Model writes: MLA is stored as MQA over the latent
    (key_length = kv latent + rope dims), the per-head sizes as the *_mla lengths."""
    m, a = shape.mla, shape.arch
    if m is None:
        return []
    A, L = gguf.Keys.Attention, gguf.Keys.LLM
    return [
        KV(L.VOCAB_SIZE.format(arch=a), shape.n_vocab, U32),
        KV(L.LEADING_DENSE_BLOCK_COUNT.format(arch=a), shape.n_dense_lead, U32),
        KV(A.Q_LORA_RANK.format(arch=a), m.q_lora_rank, U32),
        KV(A.KV_LORA_RANK.format(arch=a), m.kv_lora_rank, U32),
        KV(A.KEY_LENGTH.format(arch=a), m.kv_lora_rank + m.qk_rope_head_dim, U32),
        KV(A.VALUE_LENGTH.format(arch=a), m.kv_lora_rank, U32),
        KV(A.KEY_LENGTH_MLA.format(arch=a), m.qk_nope_head_dim + m.qk_rope_head_dim, U32),
        KV(A.VALUE_LENGTH_MLA.format(arch=a), m.v_head_dim, U32),
        KV(gguf.Keys.Rope.DIMENSION_COUNT.format(arch=a), m.qk_rope_head_dim, U32),
        KV(L.EXPERT_SHARED_COUNT.format(arch=a), shape.n_expert_shared, U32),
    ]


def _yarn_kv(shape: ModelShape) -> list[KV]:
    y, a, R = shape.yarn, shape.arch, gguf.Keys.Rope
    if y is None:
        return []
    kvs = [KV(R.SCALING_TYPE.format(arch=a), "yarn", STR),
           KV(R.SCALING_FACTOR.format(arch=a), y.factor, F32),
           KV(R.SCALING_ORIG_CTX_LEN.format(arch=a), y.original_context, U32)]
    if y.log_mul:
        kvs.append(KV(R.SCALING_YARN_LOG_MUL.format(arch=a), y.log_mul, F32))
    return kvs


def _router_kv(shape: ModelShape) -> list[KV]:
    r, a, L = shape.router, shape.arch, gguf.Keys.LLM
    if r is None:
        return []
    kvs = [KV(L.EXPERT_GATING_FUNC.format(arch=a), r.gating, U32)]
    if r.weights_scale:
        kvs.append(KV(L.EXPERT_WEIGHTS_SCALE.format(arch=a), r.weights_scale, F32))
    if r.weights_norm:
        kvs.append(KV(L.EXPERT_WEIGHTS_NORM.format(arch=a), True, BOOL))
    if r.n_group:
        kvs += [KV(L.EXPERT_GROUP_COUNT.format(arch=a), r.n_group, U32),
                KV(L.EXPERT_GROUP_USED_COUNT.format(arch=a), r.n_group_used, U32)]
    return kvs


def write_synth(
    shape: str | ModelShape,
    out: str | os.PathLike[str],
    *,
    layers: int | None = None,
    ftype: str | FileType | None = None,
    sparse: bool = False,
    seed: int = 0,
    tokenizer_from: str | os.PathLike[str] | None = None,
    routing: Routing = Routing(),
    progress: Callable[[int, int], None] | None = None,
) -> SynthResult:
    """Write a random-weight GGUF of `shape` to `out` (via a `.part` file renamed at the end).
    `ftype`: None for the shape's own (how the model is published). `sparse`: header and tensor
    infos only, the data region a hole of the right size (reads as zeros: a header for planners and
    tests, not a model to run). `tokenizer_from`: a GGUF
    whose tokenizer to copy instead of the default model's. `routing`: how MoE routers pick experts
    (routing.py)."""
    t0 = time.perf_counter()
    shape = get_shape(shape) if isinstance(shape, str) else shape
    shape = shape.truncated(layers)
    ftype = get_ftype(ftype or shape.ftype) if not isinstance(ftype, FileType) else ftype
    if not 0 <= seed < 2**32:
        raise HypuraError(f"--seed must be in [0, 2^32), got {seed}")
    out = Path(out)
    if not out.parent.is_dir():
        raise HypuraError(f"cannot write {out}: directory {out.parent} does not exist")

    tensors = plan(shape, ftype)
    infos, offset = [], 0
    for t in tensors:
        infos.append(TensorInfo(t.spec.name, t.spec.shape, t.type, offset))
        offset += _pad(t.nbytes, ALIGNMENT)
    head = header_bytes(metadata(shape, ftype, seed, sparse, tokenizer_from, routing), infos, ALIGNMENT)
    total = len(head) + offset

    tmp = out.with_name(f".{out.name}.part")
    try:
        with open(tmp, "wb") as f:
            f.write(head)
            if sparse:
                f.truncate(total)
            else:
                largest: dict[Q, int] = {}
                for t in tensors:
                    largest[t.type] = max(largest.get(t.type, 0), t.nbytes)
                _write_data(f, tensors, SynthContext(shape, seed, largest, routing), total, progress)
            if f.seek(0, os.SEEK_END) != total:
                raise AssertionError(f"wrote {f.tell()} bytes, expected {total}")
        os.replace(tmp, out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise HypuraError(f"cannot write {out}: {e.strerror or e}") from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return SynthResult(out, shape, ftype, tuple(tensors), len(head), total, time.perf_counter() - t0, sparse)


def _write_data(f: BinaryIO, tensors: list[PlannedTensor], ctx: SynthContext, total: int,
                progress: Callable[[int, int], None] | None) -> None:
    for t in tensors:
        rng = ctx.rng(2, zlib.crc32(t.spec.name.encode()))
        written = 0
        for buf in PRODUCERS[t.spec.kind](t, ctx, rng):
            if isinstance(buf, np.ndarray):
                buf = memoryview(np.ascontiguousarray(buf)).cast("B")
            written += f.write(buf)
            if progress:
                progress(f.tell(), total)
        if written != t.nbytes:
            raise AssertionError(f"{t.spec.name}: produced {written} bytes, expected {t.nbytes}")
        f.write(bytes(_pad(written, ALIGNMENT) - written))


def _pad(n: int, align: int) -> int:
    return (n + align - 1) // align * align
