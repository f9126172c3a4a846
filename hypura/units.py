"""What the planner places: a model's tensors as units with bytes, role and access probability.

A dense tensor is one unit, read by every decode token (p = 1). A stacked expert tensor
(`ffn_{gate,up,down}_exps`, numpy shape [E, ...]) is cut per expert: expert e of a layer is one unit
covering its contiguous byte range in the three stacked tensors, read with probability k/E unless
routing statistics say otherwise. Only the GGUF header is needed.
The planner places these units and the CPU profile counts its bytes and weights with them, so they sit
below both (with the sizes of llama.cpp's KV cache and compute buffer that follow from a model's shape).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hypura.errors import HypuraError
from hypura.modelfile import ModelHeader, TensorEntry

# weights only: gpt-oss's per-expert biases ([E, F], 2-D, ~1 MiB a layer) stay dense "ffn" units
_EXPERT_RE = re.compile(r"\.ffn_(gate|up|down|gate_up)_exps\.weight")

# KV cache element size: llama.cpp's default cache type is f16
KV_BYTES_PER_ELEMENT = 2.0
# llama.cpp's per-device compute buffer with flash attention (default AUTO): logits plus a few
# activations of the micro-batch in f32; measured 0.3-1.1 GiB in llama.cpp logs for 7-70B models
COMPUTE_ACTIVATIONS = 8  # activation vectors of n_embd per token held at once
COMPUTE_FLOOR = 256 << 20


@dataclass(frozen=True)
class ModelDims:
    """The architecture facts the planner needs, from the header's metadata and tensor shapes."""

    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_k: int
    head_v: int
    n_vocab: int
    n_ff: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    # multi-head latent attention (deepseek2 with {arch}.attention.key_length_mla/value_length_mla): llama.cpp caches
    # one latent per token, K only (kv_lora_rank + rope dims, as key_length), and reads V from it (llama-kv-cache.cpp)
    mla: bool = False

    @classmethod
    def from_header(cls, h: ModelHeader) -> ModelDims:
        n_embd = int(h.get("embedding_length", 0))
        n_head = int(h.get("attention.head_count", 0) or 1)
        n_head_kv = int(h.get("attention.head_count_kv", 0) or n_head)
        embd = next((t for t in h.tensors if t.name == "token_embd.weight"), None)
        n_vocab = int(h.get("vocab_size", 0) or (embd.shape[1] if embd and len(embd.shape) > 1 else 0))
        n_ff = int(h.get("feed_forward_length", 0) or 0)
        if not (h.n_layer and n_embd):
            raise HypuraError(f"{h.path}: header lacks {h.arch}.block_count/embedding_length")
        return cls(
            arch=h.arch, n_layer=h.n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
            head_k=int(h.get("attention.key_length", 0) or n_embd // n_head),
            head_v=int(h.get("attention.value_length", 0) or n_embd // n_head),
            n_vocab=n_vocab, n_ff=n_ff,
            n_expert=int(h.get("expert_count", 0) or 0),
            n_expert_used=int(h.get("expert_used_count", 0) or 0),
            n_ff_exp=int(h.get("expert_feed_forward_length", 0) or n_ff),
            mla=bool(h.get("attention.key_length_mla", 0) and h.get("attention.value_length_mla", 0)),
        )

    def kv_bytes_per_layer(self, n_ctx: int, bytes_per_element: float = KV_BYTES_PER_ELEMENT) -> int:
        """K and V of one layer for n_ctx cells (multi-head/GQA attention; MLA: the latent K alone)."""
        return int(n_ctx * self.n_head_kv * (self.head_k + (0 if self.mla else self.head_v)) * bytes_per_element)

    def compute_buffer_bytes(self, n_ubatch: int, floor: int = COMPUTE_FLOOR, n_outputs: int = 0) -> int:
        """llama.cpp's compute buffer on the computing device: micro-batch activations and the logits of its
        output rows in f32 (flash attention keeps the KQ matrix out). n_outputs: llama.cpp's n_outputs_max,
        the most rows a micro-batch computes logits for (0: every token; llama-context.cpp reserves the graph
        at min(n_ubatch, n_outputs_max) outputs)."""
        ff = max(self.n_ff, self.n_expert_used * self.n_ff_exp)
        rows = min(n_ubatch, n_outputs) if n_outputs > 0 else n_ubatch
        per_token = COMPUTE_ACTIVATIONS * self.n_embd + 2 * ff
        return max(floor, (n_ubatch * per_token + rows * self.n_vocab) * 4)


@dataclass(frozen=True)
class Unit:
    key: str  # the tensor name; an expert: "<layer prefix>ffn_exps#<e>"
    tensors: tuple[str, ...]  # tensors it covers (an expert: a slice of each stacked tensor)
    layer: int
    stage: int  # position in the graph: -1 input, the block index, n_layer for the output head
    expert: int  # -1 for a dense tensor
    role: str  # a key of plan/knobs.py ROLE_RANK
    nbytes: int
    elements: int  # weights: 2 FLOP each per token that reads the unit
    p: float  # probability a decode token reads it
    host_only: bool = False  # token_embd: llama.cpp always keeps the input layer on the CPU
    # a tied token_embd: one tensor read by the graph's first node (the input rows) and its last (the output), so
    # a stream slot would be held through the whole graph, shared with other layers (runtime/dense/layer_streamer.py)
    resident: bool = False


@dataclass(frozen=True)
class ModelUnits:
    dims: ModelDims
    units: tuple[Unit, ...]  # graph order: non-layer first, then each block
    tensors: tuple[TensorEntry, ...]
    experts: Mapping[str, int]  # stacked tensor name -> number of experts

    @property
    def weight_bytes(self) -> int:
        return sum(u.nbytes for u in self.units)


def role_of(name: str, tied_output: bool) -> str:
    if name == "token_embd.weight":
        return "output" if tied_output else "embd"  # tied: also the output matrix, read every token
    if name.startswith("output.") and "norm" not in name:
        return "output"
    if "norm" in name:
        return "norm"
    if _EXPERT_RE.search(name):
        return "expert"
    if ".ffn_gate_inp" in name or ".exp_probs_b" in name:  # exp_probs_b: deepseek-v3's selection bias
        return "router"
    if "_shexp" in name:
        return "shared"
    if ".attn_" in name:
        return "attn"
    if ".ffn_" in name:
        return "ffn"
    return "other"


def _elements(t: TensorEntry) -> int:
    n = 1
    for d in t.shape:
        n *= d
    return n


def model_units(h: ModelHeader, expert_probs: Mapping[int, Sequence[float]] | None = None) -> ModelUnits:
    """Units of a model; `expert_probs[layer]` (selection frequencies, any scale) replaces k/E."""
    dims = ModelDims.from_header(h)
    tied = not any(t.name == "output.weight" for t in h.tensors)
    units: list[Unit] = []
    stacks: dict[int, list[TensorEntry]] = {}
    experts: dict[str, int] = {}
    for t in h.tensors:
        role = role_of(t.name, tied)
        if role == "expert" and len(t.shape) == 3:
            stacks.setdefault(t.layer, []).append(t)
            experts[t.name] = t.shape[2]
            continue
        p = 1.0 / max(dims.n_vocab, 1) if role == "embd" else 1.0  # one row per token
        stage = t.layer if t.layer >= 0 else dims.n_layer if t.name.startswith("output") else -1
        units.append(Unit(t.name, (t.name,), t.layer, stage, -1, role, t.nbytes, _elements(t), p, role == "embd",
                          resident=tied and t.name == "token_embd.weight"))
    for layer in sorted(stacks):
        units.extend(_expert_units(layer, stacks[layer], dims, (expert_probs or {}).get(layer)))
    units.sort(key=lambda u: (u.stage, u.expert))  # graph order; stable: header order within a layer
    return ModelUnits(dims, tuple(units), h.tensors, experts)


def _expert_units(layer: int, stack: list[TensorEntry], dims: ModelDims, freqs: Sequence[float] | None) -> list[Unit]:
    n_expert = stack[0].shape[2]
    if any(t.shape[2] != n_expert or t.nbytes % n_expert for t in stack):
        raise HypuraError(f"layer {layer}: stacked expert tensors disagree on the expert count")
    k = dims.n_expert_used or 1
    if freqs is not None:
        if len(freqs) != n_expert or min(freqs) < 0 or sum(freqs) <= 0:
            raise HypuraError(f"routing statistics for layer {layer} need {n_expert} non-negative frequencies")
        probs = [min(1.0, k * f / sum(freqs)) for f in freqs]
    else:
        probs = [k / n_expert] * n_expert
    names = tuple(t.name for t in stack)
    nbytes = sum(t.nbytes for t in stack) // n_expert
    elements = sum(_elements(t) for t in stack) // n_expert
    prefix = f"blk.{layer}."
    return [Unit(f"{prefix}ffn_exps#{e}", names, layer, layer, e, "expert", nbytes, elements, probs[e])
            for e in range(n_expert)]
