"""`hypura synth --draft-for TARGET.gguf OUT.gguf`: a draft model for a target, with a set agreement.

Random-weight models agree only by chance, so a synthetic target needs a draft built for it. The
draft is the target itself cut to its first few blocks: the same vocabulary and metadata, the
target's token embeddings and output head byte for byte, and blocks whose output projections
(attn_output, ffn_down*) are scaled down, so that the draft's last hidden state is its token's
embedding. A target whose blocks are scaled down too (`hypura synth --block-out-scale 0.000001`) also
follows its embeddings, and then both predict from the current token through the same head.

Agreement is then set by one knob: noise on the draft's output norm, g' = g * (1 + eps * N(0, 1))
per dimension. Its logits for a token are W (g' * x) = W (g * x) + eps * W (g * N * x), x the
token's normalised embedding: linear in eps, so eps is found by bisection on a sample of tokens,
as the fraction whose argmax stays the target's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from hypura.errors import HypuraError
from hypura.modelfile import read_header
from hypura.modelfile.ggml_types import TRAITS
from hypura.modelfile.header import KV, read_kv
from hypura.modelfile.writer import TensorInfo, header_bytes

# byte offsets of the f16 scales in one block of each type: scaling them scales every value
_SCALE_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q2_K": (80, 82),
                 "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
_OUT_PROJ = re.compile(r"blk\.\d+\.(attn_output|ffn_down(_exps|_shexp|_chexps)?)\.weight$")
_BLOCK = re.compile(r"blk\.(\d+)\.")
SAMPLE_TOKENS = 256


@dataclass(frozen=True)
class DraftResult:
    path: Path
    layers: int
    eps: float
    predicted_agreement: float  # on the sampled tokens, against the target's embedding-following argmax


def _scaled(raw: np.ndarray, type_name: str, block_size: int, scale: float) -> np.ndarray:
    out = raw.copy()
    if type_name == "F32":
        return (out.view(np.float32) * np.float32(scale)).view(np.uint8)
    if type_name == "F16":
        return (out.view(np.float16) * np.float16(scale)).view(np.uint8)
    if type_name not in _SCALE_FIELDS:
        raise HypuraError(f"cannot scale a {type_name} tensor (supported: F32, F16, {', '.join(_SCALE_FIELDS)})")
    blocks = out.reshape(-1, block_size)
    for off in _SCALE_FIELDS[type_name]:
        d = blocks[:, off:off + 2].copy().view(np.float16)
        blocks[:, off:off + 2] = (d.astype(np.float32) * scale).astype(np.float16).view(np.uint8)
    return out


def _rows(mm: np.memmap, t, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) of tensor t, dequantized to float32 (n, n_embd)."""
    row_bytes = t.nbytes // t.shape[1]
    raw = np.asarray(mm[t.offset + start * row_bytes: t.offset + stop * row_bytes]).reshape(stop - start, row_bytes)
    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(int(t.ggml_type))).reshape(stop - start, -1)


def _logit_parts(mm, embd, head, g: np.ndarray, noise: np.ndarray, tokens: np.ndarray):
    """A = W (g x), B = W (g N x) for the sampled tokens' normalised embeddings x; (vocab, tokens)."""
    x = np.stack([_rows(mm, embd, int(t), int(t) + 1)[0] for t in tokens])
    x /= np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-6)
    gx, gnx = (x * g).T, (x * g * noise).T
    a, b = [], []
    for start in range(0, head.shape[1], 8192):
        w = _rows(mm, head, start, min(start + 8192, head.shape[1]))
        a.append(w @ gx)
        b.append(w @ gnx)
    return np.concatenate(a), np.concatenate(b)


def _eps_for(a: np.ndarray, b: np.ndarray, agreement: float) -> tuple[float, float]:
    want = np.argmax(a, axis=0)

    def agree(eps: float) -> float:
        return float(np.mean(np.argmax(a + eps * b, axis=0) == want))

    lo, hi = -6.0, 3.0  # log10 eps
    for _ in range(30):
        mid = (lo + hi) / 2
        if agree(10 ** mid) >= agreement:
            lo = mid
        else:
            hi = mid
    return 10 ** lo, agree(10 ** lo)


def write_draft(target: Path, out: Path, agreement: float, layers: int = 2, block_scale: float = 0.01,
                seed: int = 0) -> DraftResult:
    if not 0.0 < agreement <= 1.0:
        raise HypuraError(f"--agreement must be in (0, 1], not {agreement}")
    h = read_header(target)
    if not 1 <= layers <= h.n_layer:
        raise HypuraError(f"--layers must be in [1, {h.n_layer}] for {target.name}")
    by_name = {t.name: t for t in h.tensors}
    embd = by_name.get("token_embd.weight")
    head = by_name.get("output.weight", embd)  # tied embeddings: the head is the embedding
    norm = by_name.get("output_norm.weight")
    if embd is None or norm is None or norm.ggml_type.name != "F32":
        raise HypuraError(f"{target.name}: no token_embd, or no F32 output_norm: cannot make a draft for it")
    mm = np.memmap(target, dtype=np.uint8, mode="r")
    rng = np.random.default_rng(seed)
    g = np.frombuffer(mm[norm.offset: norm.offset + norm.nbytes], dtype=np.float32)
    noise = rng.standard_normal(g.shape[0]).astype(np.float32)
    tokens = rng.choice(embd.shape[1], size=min(SAMPLE_TOKENS, embd.shape[1]), replace=False)
    a, b = _logit_parts(mm, embd, head, g, noise, tokens)
    eps, predicted = (0.0, 1.0) if agreement >= 1.0 else _eps_for(a, b, agreement)

    kept = [t for t in h.tensors if (m := _BLOCK.match(t.name)) is None or int(m.group(1)) < layers]
    block_key = f"{h.arch}.block_count"
    kvs = [KV(kv.key, layers if kv.key == block_key else kv.value, kv.vtype, kv.sub_type) for kv in read_kv(target)]
    alignment = int(h.metadata.get("general.alignment", 32))
    infos, offset = [], 0
    for t in kept:
        infos.append(TensorInfo(t.name, tuple(reversed(t.shape)), gguf.GGMLQuantizationType(int(t.ggml_type)), offset))
        offset += t.nbytes + (-t.nbytes % alignment)
    with open(out, "wb") as f:
        f.write(header_bytes(kvs, infos, alignment))
        for t in kept:
            raw = np.asarray(mm[t.offset: t.offset + t.nbytes])
            if t is norm:
                raw = (g * (1.0 + eps * noise)).astype(np.float32).view(np.uint8)
            elif _OUT_PROJ.match(t.name):
                raw = _scaled(raw, t.ggml_type.name, TRAITS[t.ggml_type].size, block_scale)
            f.write(raw.tobytes())
            f.write(bytes(-t.nbytes % alignment))
    return DraftResult(out, layers, eps, predicted)

