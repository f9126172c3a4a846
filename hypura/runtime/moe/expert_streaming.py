"""Expert streaming: MoE layers compute small batches (decode) from a cache of expert slots.

Protocol (include/hypura.h "Expert caches" and the router hook; all on the thread running llama_decode)
  Each MoE layer L has n_slots slots: slot tensors beside its stacked expert tensors, in GPU memory
  (host memory without a GPU). `slot_of[L]` maps an expert to the slot holding its bytes, or about
  to once L's loads in flight complete; the C side's `slot_of` array lists only slots whose bytes
  are ready (published after their load was waited for; unpublished before a slot is overwritten).
  The stacked tensors stay in host memory (pinned with a GPU): the source of every load, and what
  batches larger than max_tokens compute from.
  - A batch whose selected experts all have ready slots is answered by the stream in C (slot ids
    written, the access logged): no Python. The log is replayed here, in order, before anything
    else is decided (policy scores, counters, co-activation counts).
  - Any other batch calls routed(L, selected [n_tokens, k]) after L's router ran, before L's expert
    matmuls: replay the log; wait for L's loads in flight (prefetches) and publish them; a selected
    expert with a slot is a hit; the misses take the slots of the policy's victims (never one this
    batch needs) and load (demand loads); the loads are waited for and published; write L's slot ids
    (row t, column i -> the slot of selected[t, i]); then prefetch for the
    next MoE layer the co-activation predictor's top experts into its slots, not waited for (its
    slots are free to overwrite: nothing reads them before their own hook waited, and the C side
    sees them only then). A prefetched expert counts as used at its first access, late where that
    layer's hook still waited for its loads, wasted where evicted unused (counters only: they change
    nothing that is loaded, nor when).
  Batches of more than max_tokens tokens compute from the stacked experts: nothing to do.
  With a GPU, loads run on Transfers' loader thread (copy stream, one event per layer); without
  one they are copies on this thread. Counters follow docs/design.md (expert_cache.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

from hypura.bindings.ffi import ffi, lib
from hypura.errors import HypuraError
from hypura.tiers.names import RAM
from hypura.runtime.moe.coactivation import CoactivationRecorder
from hypura.runtime.mechanism import Mechanism, TierStats
from hypura.runtime.moe.expert_cache import DEFAULT_POLICY, POLICIES, ExpertSlots
from hypura.runtime.placement import Tier
from hypura.runtime.transfers import Piece, Transfers

# a wait longer than this waited for copies still running on the GPU's copy stream: loads already done return at
# once (a set threading.Event, then the synchronize of an event already reached: microseconds of host calls)
LATE_WAIT_S = 100e-6
# host buffer types whose bytes are ggml's plain layout: slices of them copy into slots as they are
PLAIN_HOST_BUFFERS = ("CPU", "CPU_Mapped", "CUDA_Host")
EXPERT_NAMES = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")


@dataclass(frozen=True)
class ExpertCacheSettings:
    slots: int  # per MoE layer
    max_tokens: int = 1  # batches up to this many tokens use the cache (decode); needs slots >= k * max_tokens
    policy: str = DEFAULT_POLICY
    prefetch: int = -1  # experts prefetched for the next layer; -1: k (one token's worth)

    def __post_init__(self):  # checked before a model loads
        if self.policy not in POLICIES:
            raise HypuraError(f"unknown expert cache policy {self.policy!r}; known: {', '.join(POLICIES)}")
        if self.max_tokens < 1:
            raise HypuraError("expert cache settings: max_tokens must be >= 1")


class _Layer(ExpertSlots):
    """A layer's slots (the accounting in ExpertSlots) and the C cache whose slot tensors hold them."""

    def __init__(self, layer: int, c_cache, n_slots: int, policy: str):
        super().__init__(layer, n_slots, policy)
        self.c = c_cache
        self.ticket = None  # the latest load submitted (the copy stream is FIFO: it covers the earlier ones)
        self.event = ffi.NULL
        # per stacked tensor: (slot tensor, address of expert 0, bytes of one expert)
        self.parts = [(c_cache.slots[i], ffi.cast("uint8_t *", lib().ggml_get_data(c_cache.experts[i])),
                       lib().ggml_nbytes(c_cache.slots[i]) // n_slots)
                      for i in range(3) if c_cache.experts[i] != ffi.NULL]

    def evicted(self, expert: int) -> None:
        self.c.slot_of[expert] = -1  # before its slot is overwritten

    def publish(self) -> None:
        """Loads waited for: the C side may serve these experts."""
        for e, slot in self.ready():
            self.c.slot_of[e] = slot


class ExpertStreamer(Mechanism):
    name = "experts"

    def __init__(self, model, layers: tuple[int, ...], n_used: int, s: ExpertCacheSettings,
                 tier: Tier, transfers: Optional[Transfers], recorder: Optional[CoactivationRecorder]):
        """model: struct llama_model * (loaded); layers: the MoE layers in graph order."""
        if s.slots < n_used * s.max_tokens:
            raise HypuraError(f"an expert cache needs at least {n_used * s.max_tokens} slots a layer "
                              f"({n_used} experts a token x {s.max_tokens} tokens), got {s.slots}")
        super().__init__()
        self.settings, self.k, self.transfers, self.recorder = s, n_used, transfers, recorder
        self.tier_name = "gpu" if tier == Tier.GPU else "host slots"  # where hits are served
        self.layers: dict[int, _Layer] = {}
        for layer in layers:
            for name in EXPERT_NAMES:
                full = f"blk.{layer}.{name}"
                buft = lib().hypura_model_tensor_buft(model, full.encode())
                if buft != ffi.NULL and ffi.string(buft).decode() not in PLAIN_HOST_BUFFERS:
                    raise HypuraError(f"expert caches load from the stacked experts in plain host memory; "
                                      f"'{full}' is in {ffi.string(buft).decode()}")
            c = lib().hypura_expert_cache_new(model, layer, s.slots, s.max_tokens, int(tier))
            if c == ffi.NULL:
                raise HypuraError(f"cannot make an expert cache of {s.slots} slots for layer {layer} "
                                  "(not enough memory, or experts llama.cpp keeps merged or biased)")
            self.layers[layer] = _Layer(layer, c, s.slots, s.policy)
            if transfers is not None:
                self.layers[layer].event = transfers.new_event()
        self.stats = TierStats()
        self.loaded_bytes = {"demand": 0, "prefetch": 0}
        self.hook_s = 0.0
        self.stream, self._log = None, None

    def attach(self, c_stream) -> None:
        """Let the stream answer batches of ready experts in C (no routed() call for them)."""
        for layer, ly in self.layers.items():
            if lib().hypura_stream_add_expert_cache(c_stream, layer, ly.c) != 0:
                raise HypuraError(f"cannot serve layer {layer}'s expert cache from the stream")
        self.stream, self._log = c_stream, ffi.new("int32_t[]", 1 << 16)

    # --- the router hook ----------------------------------------------------------------------
    def serve(self, layer: int, selected: np.ndarray) -> None:
        if len(selected) > self.settings.max_tokens:
            return  # a larger batch computes from the stacked experts: no cache access, not counted
        self.drain()
        t0 = time.perf_counter()
        ly = self.layers[layer]
        late = self._wait(ly)  # the prefetches for this layer: used ones count late where compute waited here
        rows = selected.tolist()  # plain ints: this runs once per MoE layer and token
        demand = ly.access(rows, self.stats, self.tier_name, late)
        if demand:
            self._load(ly, demand, "demand")
            self._wait(ly)
        ly.publish()
        slot_of = ly.slot_of
        ids = np.array([[slot_of[e] for e in row] for row in rows], np.int32)
        lib().ggml_backend_tensor_set(ly.c.ids, ffi.from_buffer(ids), 0, ids.nbytes)
        self._observe(layer, rows)
        self._prefetch(layer, rows)
        self.hook_s += time.perf_counter() - t0

    def drain(self) -> None:
        """Replay the accesses the stream answered in C since the last drain (all hits), in order."""
        while self.stream is not None and (n := lib().hypura_stream_log_read(self.stream, self._log, len(self._log))):
            log, at = ffi.unpack(self._log, n), 0
            while at < n:
                layer, n_tokens, k = log[at:at + 3]
                rows = [log[at + 3 + t * k: at + 3 + (t + 1) * k] for t in range(n_tokens)]
                at += 3 + n_tokens * k
                self.layers[layer].replay(rows, self.stats, self.tier_name)
                self._observe(layer, rows)

    def _observe(self, layer: int, rows: list) -> None:
        """Note co-activations: each token's experts at the previous MoE layer, then at this one. The
        Llama adds them to the counts after each decode (CoactivationRecorder.flush)."""
        if self.recorder is not None:
            self.recorder.observe(layer, rows)

    def _prefetch(self, layer: int, rows: list) -> None:
        m = self.k if self.settings.prefetch < 0 else self.settings.prefetch
        nxt = self.recorder.next_layer.get(layer) if self.recorder is not None else None
        if nxt is None or m == 0:
            return
        guess = self.recorder.predictor.predict(self.recorder.index[layer], sorted({e for row in rows for e in row}), m)
        ly = self.layers[nxt]
        todo = ly.prefetch(guess, self.stats)
        if todo:
            self._load(ly, todo, "prefetch")

    # --- loads ------------------------------------------------------------------------------
    def _load(self, ly: _Layer, experts: list[tuple[int, int]], kind: str) -> None:
        pieces = [Piece(f"expert {e}", slots, RAM, 0, 0, size, pinned=src + e * size, at=slot * size)
                  for e, slot in experts for slots, src, size in ly.parts]
        self.loaded_bytes[kind] += sum(p.nbytes for p in pieces)
        if self.transfers is None:
            for p in pieces:
                lib().ggml_backend_tensor_set(p.tensor, p.pinned, p.at, p.nbytes)
            return
        ly.ticket = self.transfers.submit_with(ly.event, "experts", pieces)

    def _wait(self, ly: _Layer) -> bool:
        """Wait for the layer's loads in flight; True where they were not done yet (compute waited for them)."""
        if ly.ticket is None:
            return False
        pending = not ly.ticket.done.is_set()  # the loader thread has not even issued the copies
        t0 = time.perf_counter()
        ly.ticket.wait()
        ly.ticket = None
        waited = time.perf_counter() - t0
        self.stats.stall_s += waited
        return pending or waited > LATE_WAIT_S

    # --- stats --------------------------------------------------------------------------------
    def summary(self) -> dict:
        self.drain()
        st = self.stats
        return {"accesses": st.accesses, "hit_rate": {t: st.hit_rate(t) for t in st.hits},
                "prefetch": st.prefetch_dict(),
                "slots_per_layer": self.settings.slots, "layers": len(self.layers), "policy": self.settings.policy,
                "loaded_bytes": dict(self.loaded_bytes), "stall_s": st.stall_s, "hook_s": self.hook_s}

    def after_decode(self) -> None:
        self.drain()

    def reset_stats(self) -> None:
        self.drain()
        self.stats = TierStats()
        self.loaded_bytes = {"demand": 0, "prefetch": 0}
        self.hook_s = 0.0


# GPU memory the slots leave for llama.cpp's compute buffers, the KV cache of a short context and
# CUDA's own allocations (cuBLAS workspace)
GPU_RESERVE = 768 << 20


def slots_for_budget(header, gpu_budget: int, reserve: int = GPU_RESERVE) -> int:
    """Slots per MoE layer that fit a GPU budget beside every non-expert tensor (which stays on the GPU)."""
    expert_bytes = sum(t.nbytes // t.shape[2] for t in header.tensors if t.name.endswith(EXPERT_NAMES))
    if not expert_bytes:
        raise HypuraError(f"{header.path.name} has no stacked experts: expert caches are for MoE models")
    other = sum(t.nbytes for t in header.tensors if not t.name.endswith(EXPERT_NAMES))
    return max(0, (gpu_budget - other - reserve) // expert_bytes)  # expert_bytes: one expert of every layer
