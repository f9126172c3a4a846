"""Admission by KV cells, waiting, and preemption by recompute: the engine with EngineConfig.kv_unified.

The sequences present share the unified cache's cells (llama-server's --kv-unified): a sequence may hold up to
the whole cache, bounded by the model's training context (sizes.seq_limit). The engine thread runs this protocol
between steps, holding the step lock; the waiting queue is the engine's, changed under its lock:

- **Admission.** The queue is served in order, its head first, while a slot is free and the head's cells fit:
  its prompt (less a prefix it shares with a running sequence, whose cells it shares) plus a reserve for its
  reply (RESERVE_TOKENS, or fewer where it may generate fewer), beside what running sequences claim: the cells
  they hold, the rest of their prompts, and their own reserves. Cells that only cached slots hold count as free:
  they are evicted, least recently used first, when a step needs them. A request that fits alone is never
  refused: with nothing running, the head is admitted whatever its reserve. Until the head fits, it and every
  request behind it wait (FIFO: a long prompt is not overtaken for ever), each with its place in the queue in
  Engine.metrics() and /metrics.
- **A step's cells.** Every decoding sequence's next token (and its draft) goes in first; prompt chunks take
  what cells are left; cached slots are evicted until the step's tokens fit beside what llama.cpp holds.
  Where the decode tokens do not fit even without drafts, or the step would carry nothing, the youngest
  running sequence (the last admitted) is **preempted**: its KV is removed, and it goes back to the front of
  the queue with its prompt and the tokens it generated as the prompt to evaluate again. Its sampler, text
  and events stay as they were: when it is admitted again, the prefill of that prompt samples the token that
  the next decode would have, and the client's stream goes on without a gap or a repeat. It is admitted
  again only when its prompt and all it may still generate fit beside the running sequences (or nothing
  runs): sooner, the sequences that filled the cache would likely preempt it again, each time recomputing
  its whole prompt and reply for a few tokens more. A llama_decode that
  finds no cells anyway (status 1: the count here is llama.cpp's for a plain cache, not for a sliding-window
  one) preempts the youngest sequence too and runs the step again. A preempted request cancelled while it
  waits ends with what it had streamed.

`place` (both modes) puts a sequence into the slot chosen for it, with the prefix it reuses.

Off (the default), a sequence holds n_ctx / parallel cells, a request is admitted when a slot is free, and
prompts longer than a sequence's share are refused, as before: a unified cache shared this way changes what
llama_decode is given on a GPU, and stays off until it is measured there.
"""

from __future__ import annotations

from typing import Optional

from hypura.engine.prefix_cache import Choice, Slots
from hypura.engine.step import Step, plan_step

# cells a newly admitted sequence, and every running one, keeps in hand for its reply: a few steps before its
# growth can force a preemption (vLLM keeps a 1 % watermark of blocks; llama-server keeps none)
RESERVE_TOKENS = 16


class CellAdmission:
    def __init__(self, kv, slots: Slots, n_cells: int, reserve: int = RESERVE_TOKENS):
        """kv: the engine's llama context (hypura.loaded.context); slots: its Slots, whose Cells it reads."""
        self.kv, self.slots, self.n_cells, self.reserve = kv, slots, n_cells, reserve
        self.blocked = False  # the queue's head waits for cells (not for a slot)

    def as_dict(self) -> dict:
        c = self.slots.cells
        return {"total": self.n_cells, "used": c.used, "running": c.running, "head_blocked": int(self.blocked)}

    def claimed(self, active: list) -> int:
        """Cells the running sequences hold, the rest of their prompts, and their reserves."""
        return self.slots.cells.running + sum(max(len(s.feed) - s.n_past, 0) + min(self.reserve, s.tokens_left)
                                              for s in active)

    def fits(self, active: list, feed: list[int], choice: Choice, tokens_left: int, resumed: bool = False) -> bool:
        """Whether a sequence of prompt `feed`, placed by `choice`, may join `active` now (above); a resumed one
        (preempted before) reserves all it may still generate."""
        shared = choice.reuse if choice.source is not None and self.slots.active[choice.source] else 0
        reserve = tokens_left if resumed else min(self.reserve, tokens_left)
        need = len(feed) - shared + max(reserve, 1)
        self.blocked = bool(active) and self.claimed(active) + need > self.n_cells
        return not self.blocked

    def plan(self, active: list, budget: int, drafts: dict) -> Optional[Step]:
        """The next step within the cells (cached slots evicted for it); None: the youngest must be preempted."""
        room = self.n_cells - self.slots.cells.running
        decode = sum(1 + len(drafts.get(s, ())) for s in active if s.next_token is not None)
        if decode > room and drafts:
            drafts = {}
            decode = sum(s.next_token is not None for s in active)
        if decode > room:
            return None
        step = plan_step(active, budget, drafts, cells=room)
        if not step.chunks:
            return None
        self.evict(step.n_tokens)
        return step

    def evict(self, n: int) -> None:
        """Cached slots' KV removed, least recently used first, until n cells are free."""
        for slot in self.slots.cached():
            if self.n_cells - self.slots.cells.used >= n:
                return
            self.kv.seq_rm(slot)
            self.slots.evict(slot)


def place(kv, slots: Slots, choice: Choice, feed: list[int], prompt_len: int) -> int:
    """Put the chosen prefix of `feed` into the slot's KV (nothing else of the slot survives) and take the slot;
    what was reused. Both modes: it is how every sequence enters its slot."""
    slot, source, reuse = choice.slot, choice.source, choice.reuse
    if source is None or reuse == 0:
        kv.seq_rm(slot)
        reuse = 0
    elif source == slot:
        kept = kv.seq_rm(slot, reuse, -1)  # false: this memory keeps whole sequences
    else:
        kv.seq_rm(slot)
        kv.seq_cp(source, slot, 0, reuse)
        kept = True
    # e.g. a sliding-window cache that dropped the first positions, or recurrent state: evaluate it all
    if reuse and (not kept or kv.pos_min(slot) != 0 or kv.pos_max(slot) != reuse - 1):
        kv.seq_rm(slot)
        reuse = 0
    slots.take(slot, feed[:reuse], prompt_len, source)
    return reuse
