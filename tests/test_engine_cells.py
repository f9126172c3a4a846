"""The parts of EngineConfig.kv_unified that need no model: the cells each slot holds, the in-place slot choice,
admission by cells, a step planned within them, and the queue's places in /metrics. With the model:
tests/test_engine_kv_unified.py."""

from hypura.engine.admission import RESERVE_TOKENS, CellAdmission
from hypura.engine.cells import Cells
from hypura.engine.prefix_cache import Choice, Slots
from hypura.engine.step import plan_step
from hypura.engine.sizes import seq_limit
from hypura.serve.http.metrics import HttpCounts, render


def test_cells_shared_by_a_copied_prefix_are_counted_once_and_freed_with_their_last_slot():
    cells = Cells(3)
    cells.set_active(0, True)
    cells.extend(0, 10)
    cells.share(1, 0, 6)  # seq_cp(0, 1, 0, 6): the same six cells
    cells.extend(1, 2)
    assert cells.used == 12 and cells.running == 10  # slot 1 is idle: its own two are not a running slot's
    cells.set_active(1, True)
    assert cells.running == 12
    cells.cut(0, 0)  # slot 0 gone: the prefix lives on in slot 1
    assert cells.used == 8 and cells.running == 8
    cells.cut(1, 3)
    assert cells.used == 3 and cells.running == 3
    cells.set_active(1, False)
    assert cells.running == 0 and cells.used == 3


def test_slots_keep_the_cells_beside_the_tokens():
    slots = Slots(3, cross_copy=True, cache=True, shared_cells=True)
    slots.take(0, [1, 2, 3])
    slots.extend(0, [4, 5])
    slots.release(0, keep=True)
    slots.take(1, [1, 2, 3], prompt_len=6, source=0)  # its prefix copied from the cached slot
    slots.extend(1, [7, 8, 9])
    assert slots.cells.used == 8 and slots.cells.running == 6
    assert slots.cached() == [0]
    slots.evict(0)
    assert slots.kv[0] == [] and slots.cells.used == 6 and slots.cached() == []
    off = Slots(2, cross_copy=True, cache=True)  # kv_unified off: nothing counts them
    off.take(0, [1, 2, 3])
    assert off.cells.used == 0

def test_in_place_a_cached_slot_that_loses_nothing_is_taken_only_with_the_switch():
    """kv_unified: a cached slot whose KV is all in the new prompt (a conversation going on), or whose prompt was
    this prompt (a reply made again), is taken in place: its old cells are not kept beside the new sequence."""
    def cached(shared_cells):
        slots = Slots(3, cross_copy=True, cache=True, shared_cells=shared_cells)
        slots.take(0, [1, 2], prompt_len=3)  # prompt [1, 2, 3] with [1, 2] reused
        slots.extend(0, [3, 50, 51])  # its last prompt token and its reply, evaluated
        slots.release(0, keep=True)
        return slots

    on, off = cached(True), cached(False)
    assert on.choose([1, 2, 3]) == Choice(slot=0, source=0, reuse=2)  # made again: the reply is replaced
    assert on.choose([1, 2, 3, 50, 51, 4]) == Choice(slot=0, source=0, reuse=5)  # the next turn
    assert on.choose([1, 2, 4]) == Choice(slot=1, source=0, reuse=2)  # another prompt: the reply stays cached
    # off: as before, a free slot takes the copy and the cached slot keeps its KV
    assert off.choose([1, 2, 3]) == Choice(slot=1, source=0, reuse=2)
    assert off.choose([1, 2, 3, 50, 51, 4]) == Choice(slot=1, source=0, reuse=5)


def test_a_sequence_may_hold_the_cache_within_the_training_context():
    assert seq_limit(4096, 8192, 1024) == 4096
    assert seq_limit(65536, 8192, 16384) == 16384  # asked past the training context per sequence: kept
    assert seq_limit(65536, 8192, 4096) == 8192
    assert seq_limit(1024, 0, 256) == 1024  # no training context known


class _Kv:
    def __init__(self):
        self.removed = []

    def seq_rm(self, slot, p0=-1, p1=-1):
        self.removed.append(slot)
        return True


class _seq:  # a Sequence as admission and the scheduler read it (hashable: drafts are keyed by sequence)
    def __init__(self, slot, feed, n_past, next_token=None, left=100):
        self.slot, self.feed, self.prompt, self.n_past, self.next_token = slot, feed, feed, n_past, next_token
        self.tokens_left, self.prefilling = left, n_past < len(feed)


def _admission(n_cells=64, running=(), cached=()):
    """Slots 0.. running (each holding n cells), then cached slots, in a cache of n_cells."""
    slots = Slots(4, cross_copy=True, cache=True, shared_cells=True)
    for s, n in enumerate(running):
        slots.take(s, [s] * n)
    for s, n in enumerate(cached, start=len(running)):
        slots.take(s, [s] * n)
        slots.release(s, keep=True)
    return CellAdmission(_Kv(), slots, n_cells), slots


def test_a_request_is_admitted_when_its_prompt_and_reserve_fit_beside_what_running_sequences_claim():
    adm, slots = _admission(64, running=[20])
    a = _seq(0, [0] * 20, 20, next_token=5)
    new = Choice(slot=1, source=None, reuse=0)
    assert adm.claimed([a]) == 20 + RESERVE_TOKENS
    assert adm.fits([a], [9] * (64 - 36 - RESERVE_TOKENS), new, 100) and not adm.blocked
    assert not adm.fits([a], [9] * (64 - 36 - RESERVE_TOKENS + 1), new, 100) and adm.blocked
    # a reply of 2 tokens at most reserves 2; a prefix shared with a running sequence is its cells already
    assert adm.fits([a], [9] * 26, new, 2)
    assert adm.fits([a], [0] * 30, Choice(slot=1, source=0, reuse=20), 100)
    assert not adm.fits([a], [0] * 30, Choice(slot=1, source=None, reuse=0), 100)
    # alone, a request that fits the cache is always admitted
    assert adm.fits([], [9] * 63, new, 100)
    # a prompt still to evaluate is claimed before its cells are filled
    b = _seq(1, [7] * 30, 10)
    assert adm.claimed([a, b]) == 20 + RESERVE_TOKENS + 20 + RESERVE_TOKENS
    # a sequence past its prompt (n_past counts its reply) claims its cells and its reserve, nothing less
    adm, _ = _admission(64, running=[30])
    d = _seq(0, [0] * 20, 30, next_token=5, left=4)
    assert adm.claimed([d]) == 30 + 4
    # a preempted sequence comes back only when all it may still generate fits too
    assert adm.fits([], [9] * 40, new, 100, resumed=True)  # alone: always
    assert adm.fits([d], [9] * 10, new, 20, resumed=True) and not adm.fits([d], [9] * 10, new, 21, resumed=True)
    assert adm.fits([d], [9] * 10, new, 21)  # a new one reserves RESERVE_TOKENS only


def test_a_step_takes_the_cells_running_sequences_leave_evicting_cached_slots_least_recently_used_first():
    adm, slots = _admission(64, running=[20], cached=[30, 10])
    a = _seq(0, [0] * 20, 20, next_token=5)
    p = _seq(3, [7] * 100, 0)
    step = adm.plan([a, p], budget=64, drafts={})
    assert [len(c.tokens) for c in step.chunks] == [1, 43]  # all but the running sequence's 20 cells
    assert adm.kv.removed == [1, 2] and slots.cached() == []  # both cached slots went, the older first
    adm, _ = _admission(64, running=[20], cached=[30])
    step = adm.plan([a], budget=64, drafts={})
    assert step.n_tokens == 1 and adm.kv.removed == []  # 14 cells free: nothing to evict


def test_a_step_whose_decode_tokens_do_not_fit_drops_its_drafts_then_asks_for_a_preemption():
    a, b = _seq(0, [0] * 20, 20, next_token=5), _seq(1, [1] * 20, 20, next_token=6)
    adm, _ = _admission(44, running=[20, 20])
    assert [c.tokens for c in adm.plan([a, b], budget=64, drafts={a: [1, 2]}).chunks] == [[5, 1, 2], [6]]
    adm, _ = _admission(43, running=[20, 20])
    assert [c.tokens for c in adm.plan([a, b], budget=64, drafts={a: [1, 2]}).chunks] == [[5], [6]]
    adm, _ = _admission(40, running=[20, 20])
    assert adm.plan([a, b], budget=64, drafts={}) is None  # the engine preempts the youngest
    adm, _ = _admission(40, running=[20, 19])
    p = _seq(1, [1] * 30, 19)
    assert adm.plan([a, p], budget=64, drafts={}) is not None  # one cell: a's next token, nothing for p's prompt
    adm, _ = _admission(40, running=[20, 20])
    assert adm.plan([_seq(0, [0] * 30, 20), _seq(1, [1] * 30, 20)], budget=64, drafts={}) is None  # no room at all


def test_prompt_chunks_stay_within_the_cells_given():
    a = _seq(0, [1, 2], 2, next_token=7)
    p = _seq(1, list(range(100)), 0)
    assert [len(c.tokens) for c in plan_step([a, p], budget=64, cells=10).chunks] == [1, 9]
    assert [len(c.tokens) for c in plan_step([a, p], budget=64).chunks] == [1, 63]


def test_metrics_give_each_waiting_request_its_place_labelled_by_id():
    tree = {"requests": {"queued": 2}, "queue": [{"id": 7, "position": 0, "waited_s": 1.5, "resumed": True},
                                                 {"id": 9, "position": 1, "waited_s": 0.25, "resumed": False}]}
    text = render({"m": tree}, HttpCounts(()), True)
    assert 'hypura_engine_queue_position{model="m",request="7"} 0' in text
    assert 'hypura_engine_queue_position{model="m",request="9"} 1' in text
    assert 'hypura_engine_queue_waited_seconds{model="m",request="9"} 0.25' in text
    assert "queue_position" not in render({"m": {"queue": []}}, HttpCounts(()), True)
