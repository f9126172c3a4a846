"""The layer streamer: streamed layers go through pool slots ahead of use while llama.cpp computes.

Protocol (compute hooks of include/hypura.h; the C side calls them on the thread running
llama_decode, with the GIL taken by cffi)
  State lives on that thread: `owner[pool][slot]` is the layer whose bytes are in the slot or on
  their way; `free[pool][slot]` turns true at the owner's after(), when nothing reads it any more.
  - before(L), before the first node reading L's weights is launched: unless L owns its slot
    already, the slot must be free (it is: layers take slots round-robin and the previous owner
    ran earlier) and L is loaded now, a demand load. Then wait for L's ticket (../transfers.py):
    the time waited is stall time. Then prefetch.
  - after(L), once every node reading L ran and its backend synchronized: L's slot is free, its
    bytes stay valid until another layer takes the slot (all layers fit: nothing is copied again).
    Then prefetch.
  - prefetch: walk the layers after L in graph order, cyclically (the next token starts over),
    up to the plan's prefetch depth; submit each one not in its slot while its slot is free;
    stop at the first whose slot is busy, so loads stay in graph order.
  - routed(layer, ids), with a Router: the layer's chosen experts, handed to its callback.
  - set_step(tokens), before each llama_decode, on the same thread (per-step paths): where the plan
    has a table of paths by step size, each dual tensor (stream_layout.py) goes home, where the CPU
    computes it, or into a slot, streamed. On a change, every load in flight is waited for first,
    the layers streamed now take the slots round-robin again, and C builds the next graph anew.
  A Python error in a hook is stored and the hooks do nothing more in that decode (C computes on, over
  whatever the slots hold); the Llama raises it after the decode that hit it (`raise_pending`), so no
  logits computed from missing weights leak. Raising empties every slot, once no load is in flight: the
  next decode loads each layer afresh, and a transient read error voids one decode, not the model.
  One loader thread does the I/O (../transfers.py); the hooks only submit and wait.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Callable, Optional

from hypura.bindings.ffi import ffi, lib
from hypura.errors import HypuraError
from hypura.tiers.names import DISK, RAM
from hypura.runtime.mechanism import Mechanism
from hypura.runtime.placement import FileFiller, TensorInfo
from hypura.runtime.router import Router, selected_ids
from hypura.runtime.dense.stream_layout import GPU_POOL, HOST_POOL, StreamLayout
from hypura.runtime.transfers import Piece, Transfers


class LayerStreamer(Mechanism):
    def __init__(self, layout: StreamLayout, files: FileFiller, depth: int, router: Optional[Router] = None,
                 readers: int = 1, streamed_at: Optional[Callable[[int], frozenset]] = None, homes=None):
        """streamed_at(tokens): the dual tensors a step of that many tokens streams (the plan's step_paths);
        homes: where RAM-tier tensors' bytes live, the mapped file (../mapped_weights.py), which a layout with
        RAM sources needs."""
        super().__init__()
        self.layout, self.files, self.depth, self.router, self.homes = layout, files, depth, router, homes
        if homes is None and layout.pinned_bytes():
            raise HypuraError("streamed RAM-tier tensors need their home in the mapped model file")
        self.streamed_at = streamed_at
        self.dual = {name for name, s in layout.tensors.items() if s.dual}
        self.streamed: Optional[frozenset] = None  # dual tensors in slots now; None: all (as loaded)
        self.path_changes = 0
        self.stats = self.traffic  # bytes loaded into slots by source tier, loads, stall
        self.timeline: list = []  # this decode's hooks: (before|after, layer, perf_counter s)
        self.error: Optional[BaseException] = None
        gpu_disk = any(s.pool == GPU_POOL and s.source == DISK for s in layout.tensors.values())
        self.transfers = Transfers(files.paths, {p: n for p, n in layout.slots.items() if layout.layers(p)}, gpu_disk,
                                   readers=readers)
        self.pieces: dict[tuple[str, int], list[Piece]] = defaultdict(list)  # (pool, layer) -> tensors
        self.in_slots: dict[tuple[str, int], list[Piece]] = defaultdict(list)  # of those, the ones streamed now
        self.order = {pool: layout.layers(pool) for pool in layout.slots}  # layers streamed now, graph order
        self.slot = dict(layout.layer_slot)  # (pool, layer) -> its slot now
        self.owner = {pool: [None] * n for pool, n in layout.slots.items()}
        self.free = {pool: [True] * n for pool, n in layout.slots.items()}
        self.tickets: dict[tuple[str, int], object] = {}
        # 0 on error: C's stream stays usable (a hook answering non-zero stops it for good)
        self._before_cb = ffi.callback("hypura_unit_fn", self._unless_failed(self._before), error=0,
                                       onerror=self._on_error)
        self._after_cb = ffi.callback("hypura_unit_fn", self._unless_failed(self._after), error=0,
                                      onerror=self._on_error)
        self._routed_cb = ffi.callback("hypura_route_fn", self._unless_failed(self._routed), error=0,
                                       onerror=self._on_error)
        hooks = ffi.new("struct hypura_stream_hooks *",
                        {"before": self._before_cb, "after": self._after_cb, "routed": self._routed_cb})
        self.c_stream = lib().hypura_stream_new(hooks)
        for layer in router.layers if router else ():
            lib().hypura_stream_add_router(self.c_stream, layer)
        lib().hypura_stream_profile(self.c_stream, True)  # one mark per graph split, read after each decode

    # --- load time -------------------------------------------------------------------------
    def fill(self, info: TensorInfo, tensor) -> None:
        """The loader's fill hook for a pooled tensor: register it; a RAM-tier one's source is its home in the
        mapped file (pinned there after the load)."""
        s = self.layout.tensors[info.name]
        piece = Piece(info.name, tensor, s.source, info.file_idx, info.file_offset, info.nbytes)
        if s.source == RAM:
            piece.pinned = self.homes.home(info)
        unit = self._unit(s.pool, s.layer)
        if lib().hypura_stream_add(self.c_stream, tensor, unit) != 0:
            raise HypuraError(f"cannot stream tensor '{info.name}' (more than 64 in one layer?)")
        if s.dual and lib().hypura_stream_set_home(self.c_stream, tensor, self.homes.buffer(info.file_idx),
                                                   piece.pinned) != 0:
            raise HypuraError(f"cannot give tensor '{info.name}' a home in host memory")
        self.pieces[(s.pool, s.layer)].append(piece)
        self.in_slots[(s.pool, s.layer)].append(piece)

    # --- per-step paths (set_step in the protocol above) --------------------------------------
    def set_step(self, tokens: int) -> None:
        if not self.dual or self.streamed_at is None:
            return
        streamed = self.streamed_at(tokens)
        if streamed is self.streamed or streamed == self.streamed:
            return
        for ticket in self.tickets.values():  # no load may land in a slot that changes hands
            ticket.wait()
        self.tickets.clear()
        L, layout = lib(), self.layout
        layers = {pool: sorted({s.layer for s in layout.tensors.values() if s.pool == pool
                                and (not s.dual or s.name in streamed)}) for pool in layout.slots}
        for pool, n in layout.slots.items():
            self.order[pool] = layers[pool]
            self.slot.update({(pool, layer): i % n for i, layer in enumerate(layers[pool])})
            self.owner[pool], self.free[pool] = [None] * n, [True] * n
        self.in_slots.clear()
        for (pool, layer), pieces in self.pieces.items():
            for p in pieces:
                home = p.name in self.dual and p.name not in streamed
                if L.hypura_stream_place(self.c_stream, p.tensor, -1 if home else self.slot[(pool, layer)]) != 0:
                    raise HypuraError(f"cannot move tensor '{p.name}' {'home' if home else 'into its slot'}")
                if not home:
                    self.in_slots[(pool, layer)].append(p)
        self.streamed = streamed
        self.path_changes += 1

    def eval_callback(self) -> tuple[int, int]:
        """(function address, user data) for llama_context_params.cb_eval."""
        fn = ffi.cast("uintptr_t", ffi.addressof(lib(), "hypura_stream_eval"))
        return int(fn), int(ffi.cast("uintptr_t", self.c_stream))

    # --- compute time (the protocol above) ----------------------------------------------------
    @staticmethod
    def _unit(pool: str, layer: int) -> int:
        return layer * 2 + (pool != GPU_POOL)  # a layer may have tensors in both pools

    def _on_error(self, exc_type, exc, tb) -> None:
        if self.error is None:
            self.error = exc

    def _unless_failed(self, hook):
        """`hook`, doing nothing once this decode failed: its results are void anyway."""
        return lambda *args: 0 if self.error is not None else hook(*args)

    def _before(self, unit: int, _user_data) -> int:
        pool, layer = (GPU_POOL if unit % 2 == 0 else HOST_POOL), unit // 2
        self.timeline.append(("before", layer, time.perf_counter()))
        slot = self.slot[(pool, layer)]
        if self.owner[pool][slot] != layer:
            if not self.free[pool][slot]:
                raise HypuraError(f"layer {layer} needs slot {slot}, still used by layer {self.owner[pool][slot]}")
            self._submit(pool, layer, slot)
            self.stats.demand_loads += 1
        self.free[pool][slot] = False
        ticket = self.tickets.pop((pool, layer), None)
        if ticket is not None:
            t0 = time.perf_counter()
            ticket.wait()
            self.stats.stall_s += time.perf_counter() - t0
            self.stats.waits += 1
        self._prefetch(pool, layer)
        return 0

    def _after(self, unit: int, _user_data) -> int:
        pool, layer = (GPU_POOL if unit % 2 == 0 else HOST_POOL), unit // 2
        self.timeline.append(("after", layer, time.perf_counter()))
        self.free[pool][self.slot[(pool, layer)]] = True
        self._prefetch(pool, layer)
        return 0

    def _routed(self, layer: int, selected, _user_data) -> int:
        r = self.router
        r.callback(layer, selected_ids(selected, r.n_expert, r.n_used))
        return 0

    def _submit(self, pool: str, layer: int, slot: int) -> None:
        pieces = self.in_slots[(pool, layer)]
        self.owner[pool][slot], self.free[pool][slot] = layer, False
        self.tickets[(pool, layer)] = self.transfers.submit(pool, slot, pieces)
        self.stats.loads += 1
        for p in pieces:
            self.stats.bytes[p.source] += p.nbytes

    def _prefetch(self, pool: str, layer: int) -> None:
        order = self.order[pool]
        i = order.index(layer)
        for k in range(1, min(self.depth, len(order) - 1) + 1):
            nxt = order[(i + k) % len(order)]
            slot = self.slot[(pool, nxt)]
            if self.owner[pool][slot] == nxt:
                continue
            if not self.free[pool][slot]:
                return
            self._submit(pool, nxt, slot)

    # --- after a decode -----------------------------------------------------------------------
    def split_marks(self, t0_us: int) -> list:
        """[(ms after t0_us, backend, first node)] of each graph split computed since the last read."""
        out, buf = [], ffi.new("struct hypura_split_mark[256]")
        while (n := lib().hypura_stream_profile_read(self.c_stream, buf, 256)) > 0:
            out += [(round((m.t_us - t0_us) / 1e3, 3), ffi.string(m.backend).decode(), ffi.string(m.node).decode())
                    for m in buf[0:n]]
        return out

    def after_decode(self) -> None:
        self.raise_pending()

    def raise_pending(self) -> None:
        if self.error is not None or (self.c_stream != ffi.NULL and lib().hypura_stream_failed(self.c_stream)):
            error = self.error or HypuraError("streaming weights failed")
            self._empty_slots()
            raise HypuraError(f"weights could not be streamed, the results are void: {error}") from error

    def _empty_slots(self) -> None:
        """After a failed decode: every load in flight landed or failed, no layer owns a slot, no error stored."""
        for ticket in self.tickets.values():
            ticket.done.wait()
        self.tickets.clear()
        for pool, n in self.layout.slots.items():
            self.owner[pool], self.free[pool] = [None] * n, [True] * n
        self.error = None

    def close(self) -> None:
        """After the llama context using the stream is freed."""
        self.transfers.close()
        if self.c_stream != ffi.NULL:
            lib().hypura_stream_free(self.c_stream)
            self.c_stream = ffi.NULL
