"""The batched engine's parts that need no model: text release, slot and prefix choice, step planning,
settings, the batched bench's bound."""

import types

import pytest

from hypura.engine import EngineConfig, SamplingParams
from hypura.engine.prefix_cache import Choice, Slots, common_prefix
from hypura.engine.step import plan_step
from hypura.engine.text import TextStream
from hypura.errors import HypuraError


def _stream(pieces, stop=()):
    """A TextStream over a toy vocabulary: token i is pieces[i] (bytes)."""
    return TextStream(lambda t: pieces[t], tuple(stop))


def test_a_character_split_over_tokens_is_released_whole():
    snow = "☃".encode()  # 3 bytes
    s = _stream([snow[:1], snow[1:2], snow[2:], b"!"])
    assert [s.push(t) for t in (0, 1, 2, 3)] == ["", "", "☃", "!"]
    s = _stream([snow[:2]])
    assert s.push(0) == "" and s.flush() == "\ufffd"  # cut short at the end: replaced, not lost


def test_text_that_may_start_a_stop_string_waits_and_the_stop_is_never_released():
    s = _stream([b"Hello ", b"wor", b"ld", b" END", b"ER", b"x"], stop=["END", "ENDER"])
    assert s.push(0) == "Hello "
    assert s.push(1) == "wor" and s.push(2) == "ld"
    assert s.push(3) == " " and s.stopped and s.text == "Hello world "  # cut before the stop string
    assert s.push(4) == "" and s.flush() == ""  # nothing after it
    s = _stream([b"a", b" EN", b"Dx"], stop=["END"])
    assert s.push(0) == "a" and s.push(1) == " " and s.push(2) == "" and s.stopped
    assert s.text == "a " and s.flush() == ""


def test_held_text_is_released_when_it_turns_out_not_to_be_a_stop():
    s = _stream([b"x E", b"N", b"Q"], stop=["END"])
    assert s.push(0) == "x " and s.push(1) == "" and s.push(2) == "ENQ" and not s.stopped
    s = _stream([b"x E"], stop=["END"])
    assert s.push(0) == "x " and s.flush() == "E"  # the end: what was held goes out


def test_the_earliest_stop_string_wins():
    s = _stream([b"one two three"], stop=["three", "two"])
    assert s.push(0) == "one " and s.stopped and s.text == "one "


def test_common_prefix():
    assert common_prefix([1, 2, 3, 4], [1, 2, 9]) == 2
    assert common_prefix([], [1]) == 0 and common_prefix([5, 6], [5, 6]) == 2
    assert common_prefix(list(range(1000)), list(range(700)) + [-1]) == 700


def test_a_new_prompt_copies_the_longest_shared_prefix_into_a_free_slot():
    slots = Slots(3, cross_copy=True, cache=True)
    slots.take(0, [1, 2, 3, 4, 5])
    slots.release(0, keep=True)  # cached
    slots.take(1, [1, 2, 9])  # running
    # a free slot takes it; the cached slot keeps its KV; the prefix comes from the longest match
    assert slots.choose([1, 2, 3, 4, 7, 8]) == Choice(slot=2, source=0, reuse=4)
    # at least the last prompt token is evaluated again, for its logits
    assert slots.choose([1, 2, 3, 4, 5]) == Choice(slot=2, source=0, reuse=4)
    assert slots.choose([1, 2, 9, 9]) == Choice(slot=2, source=1, reuse=3)  # from a running sequence
    assert slots.choose([7]) == Choice(slot=2, source=None, reuse=0)


def test_with_every_slot_cached_the_least_recently_used_one_goes():
    slots = Slots(2, cross_copy=True, cache=True)
    for s, toks in ((0, [1, 1]), (1, [2, 2])):
        slots.take(s, toks)
        slots.release(s, keep=True)
    assert slots.choose([3, 3]) == Choice(slot=0, source=None, reuse=0)
    assert slots.choose([2, 2, 5]) == Choice(slot=0, source=1, reuse=2)  # slot 1's KV survives the copy
    slots.take(0, [1, 1])
    slots.release(0, keep=True)  # now slot 1 is the older
    assert slots.choose([2, 2, 5]) == Choice(slot=1, source=1, reuse=2)  # in place
    slots.take(0, [])
    slots.take(1, [])
    assert slots.choose([1]) is None  # all busy


def test_without_cross_copies_a_prompt_reuses_only_its_own_slot_and_without_a_cache_nothing():
    slots = Slots(3, cross_copy=False, cache=True)
    slots.take(0, [1, 2, 3])
    slots.release(0, keep=True)
    slots.take(1, [4, 5, 6])  # running: its KV cannot be copied across streams
    assert slots.choose([1, 2, 3, 9]) == Choice(slot=0, source=0, reuse=3)
    assert slots.choose([4, 5, 7]) == Choice(slot=2, source=None, reuse=0)
    nocache = Slots(2, cross_copy=True, cache=False)
    nocache.take(0, [1, 2, 3])
    nocache.release(0, keep=True)
    assert nocache.kv[0] == [] and nocache.choose([1, 2, 3, 4]) == Choice(slot=0, source=None, reuse=0)


def _seq(prompt, n_past, next_token=None):
    return types.SimpleNamespace(prompt=prompt, feed=prompt, n_past=n_past, next_token=next_token, slot=0,
                                 prefilling=n_past < len(prompt))


def test_a_step_carries_decode_tokens_first_then_prompt_chunks_within_the_budget():
    running = [_seq([1, 2], 2, next_token=7), _seq([3], 1, next_token=8)]
    long = _seq(list(range(100)), 10)
    later = _seq([5, 6, 7], 0)
    step = plan_step([running[0], long, running[1], later], budget=32)
    kinds = [(c.prompt, len(c.tokens), c.pos, c.sample) for c in step.chunks]
    # both decode tokens, then 30 prompt tokens of the oldest prefilling request, none left for the next
    assert kinds == [(False, 1, 2, True), (False, 1, 1, True), (True, 30, 10, False)]
    assert step.chunks[2].tokens == list(range(10, 40))
    assert step.n_tokens == 32 and step.prompt_tokens == 30 and not step.decode_only
    # a chunk that ends its prompt asks for logits; a step of generated tokens only is decode
    step = plan_step([_seq(list(range(100)), 90), later], budget=64)
    assert [(len(c.tokens), c.sample) for c in step.chunks] == [(10, True), (3, True)]
    assert plan_step(running, budget=2).decode_only


def test_settings_are_checked_with_one_line():
    with pytest.raises(HypuraError, match="bad engine settings: parallel 0"):
        EngineConfig(parallel=0)
    with pytest.raises(HypuraError, match="step_tokens 2 .want >= parallel 4"):
        EngineConfig(parallel=4, step_tokens=2)
    with pytest.raises(HypuraError, match="max_queue 0"):
        EngineConfig(max_queue=0)
    with pytest.raises(HypuraError, match="bad sampling settings: max_tokens 0"):
        SamplingParams(max_tokens=0)


def test_the_batched_bound_grows_with_the_batch_and_counts_the_experts_a_batch_touches(tiny_llama, tiny_qwen3moe):
    from hypura.speed.bound import bound
    from hypura.cli.bench_cmd import parse_sizes
    from hypura.modelfile import read_header
    from hypura.plan import Rates

    cpu = Rates(cpu_read=10e9, disk_read=1e9)
    dense = read_header(tiny_llama)
    weights = sum(t.nbytes for t in dense.tensors if t.name != "token_embd.weight")
    one, four = bound(dense, None, cpu, 1, on_gpu=False), bound(dense, None, cpu, 4, on_gpu=False)
    assert one["step_bytes"]["cpu"] == weights and one["decode_tok_s"] == pytest.approx(10e9 / weights)
    assert four["decode_tok_s"] == pytest.approx(4 * one["decode_tok_s"])  # the same bytes serve 4 tokens
    moe = read_header(tiny_qwen3moe)  # 16 experts, 4 of them a token
    experts = sum(t.nbytes for t in moe.tensors if "_exps" in t.name)
    rest = sum(t.nbytes for t in moe.tensors if "_exps" not in t.name and t.name != "token_embd.weight")
    for b in (1, 2, 8):
        got = bound(moe, None, cpu, b, on_gpu=False)["step_bytes"]["cpu"]
        assert got == pytest.approx(rest + experts * (1 - (1 - 4 / 16) ** b))
    assert bound(dense, None, Rates(cpu_read=1e9, disk_read=1e9, gpu_read=1e12, link=5e10), 1) is None  # -ngl N
    assert parse_sizes("--parallel", "1,4, 16", 1) == (1, 4, 16)
    with pytest.raises(HypuraError, match="--parallel '0,2'"):
        parse_sizes("--parallel", "0,2", 1)
