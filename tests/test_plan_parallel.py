"""The cost model and planner with parallel sequences: a decode step carries one token of each.

Shape checks on synthetic GGUFs of real shapes (headers only matter) with the bundled H200 profile, and
vanilla llama.cpp's batched decode as the issue's H200 runs measured it (llama-batched-bench -npp 128
-ntg 16, 2026-12-04)."""

from __future__ import annotations

import dataclasses

import pytest

from hypura.modelfile import read_header
from hypura.plan import Plan, PlanSettings, knobs, model_units, plan_model, predict, rates_for, traffic
from hypura.plan.cost import step_probability
from hypura.profile import resolve_profile
from hypura.synth import writer

H200 = resolve_profile("h200-design")
RATES = rates_for(H200)
CTX_PER_SEQ = 145  # npp 128 + ntg 16 + 1


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    cache = {}

    def get(shape: str):
        if shape not in cache:
            path = folder / f"{shape}.gguf"
            writer.write_synth(shape, path, ftype="q4_k_m", sparse=True)
            cache[shape] = read_header(path)
        return cache[shape]

    return get


def _placed(mu, on_cpu):
    """A fixed placement: units `on_cpu(u)` in RAM computed by the CPU, the rest GPU-resident."""
    tiers = ["ram" if on_cpu(u) or u.host_only else "gpu" for u in mu.units]
    return tiers, ["cpu" if t == "ram" else "gpu" for t in tiers]


def _vanilla(mu, on_cpu, parallel, pinned=False):
    """llama.cpp's placement: mmap'd CPU weights (pageable, repacked), or pinned ones (-lm none)."""
    tiers, compute = _placed(mu, on_cpu)
    kv = mu.dims.kv_bytes_per_layer(parallel * CTX_PER_SEQ) * mu.dims.n_layer
    return traffic(mu, tiers, compute, "gpu", kv, RATES, parallel=parallel, pinned=pinned)


def test_step_time_grows_with_the_batch_and_aggregate_rate_too(model):
    mu = model_units(model("llama3.3-70b"))
    steps, aggregate = [], []  # -ngl 14: the last 14 layers on the GPU
    for b in (1, 2, 4, 8, 16, 31):
        pr = predict(_vanilla(mu, lambda u: u.layer < 66, b), RATES)
        steps.append(b / pr.decode_tok_s)
        aggregate.append(pr.decode_tok_s)
    assert steps == sorted(steps) and aggregate == sorted(aggregate)
    # one sequence: no FLOP term, the one-token rates alone
    one = _vanilla(mu, lambda u: u.layer < 66, 1)
    assert predict(one, RATES).seconds["cpu"] == pytest.approx(one.cpu_bytes / RATES.cpu_read)


def test_a_batch_widens_the_experts_a_step_reads(model):
    mu = model_units(model("qwen3-30b-a3b"))
    e, k = mu.dims.n_expert, mu.dims.n_expert_used
    expert_bytes = sum(u.nbytes for u in mu.units if u.expert >= 0)
    dense_cpu = sum(u.nbytes * step_probability(u.p, 1) for u in mu.units if u.host_only)
    kv = mu.dims.kv_bytes_per_layer(CTX_PER_SEQ) * mu.dims.n_layer
    for b in (1, 4, 16):
        t = _vanilla(mu, lambda u: u.expert >= 0, b)
        distinct = e * (1 - (1 - k / e) ** b)  # expected distinct experts of a layer over b tokens
        embd = sum(u.nbytes * step_probability(u.p, b) for u in mu.units if u.host_only)
        assert t.cpu_bytes - embd == pytest.approx(expert_bytes * distinct / e, rel=1e-6)
        assert t.parallel == b and kv > 0 and dense_cpu > 0
    assert step_probability(1.0, 64) == 1.0 and step_probability(0.0, 64) == 0.0


def test_op_offload_copies_host_weights_from_32_tokens_on(model):
    mu = model_units(model("qwen3-30b-a3b"))
    below, at = _vanilla(mu, lambda u: u.expert >= 0, 31), _vanilla(mu, lambda u: u.expert >= 0, 32)
    expert_bytes = sum(u.nbytes for u in mu.units if u.expert >= 0)
    assert knobs.OP_OFFLOAD_MIN_BATCH == 32
    assert below.offload_bytes == 0 and predict(below, RATES).decode_limit == "cpu"
    # llama.cpp's scheduler copies the experts the step's tokens select (ggml-backend.cpp), not whole stacks
    used = sum(u.nbytes * step_probability(u.p, 32) for u in mu.units if u.expert >= 0)
    assert at.offload_bytes == pytest.approx(used) and used < expert_bytes
    pr = predict(at, RATES)
    assert pr.decode_limit == "offload" and pr.seconds["offload"] == pytest.approx(used / RATES.pageable_rate)
    assert pr.decode_tok_s < predict(below, RATES).decode_tok_s  # why vanilla is slower at 32 than at 16
    # the same weights held pinned (-lm none; a plan that streams): copied at the link's rate, read by the CPU
    # at its plain-layout rate below 32 tokens
    plain = dataclasses.replace(RATES, cpu_read_plain=RATES.cpu_read * 0.8)
    pinned = _vanilla(mu, lambda u: u.expert >= 0, 32, pinned=True)
    assert predict(pinned, plain).seconds["offload"] == pytest.approx(used / RATES.link)
    assert predict(pinned, plain).decode_tok_s > 3 * pr.decode_tok_s
    one = _vanilla(mu, lambda u: u.expert >= 0, 1, pinned=True)
    assert predict(one, plain).seconds["cpu"] == pytest.approx(one.cpu_bytes / plain.cpu_read_plain)
    # beside CPU weights from disk the runtime turns op offload off: the CPU computes the batch
    last = max(u.layer for u in mu.units if u.expert >= 0)
    tiers, compute = _placed(mu, lambda u: u.expert >= 0)
    tiers = ["disk" if u.expert >= 0 and u.layer == last else t for u, t in zip(mu.units, tiers)]
    kv = mu.dims.kv_bytes_per_layer(32 * CTX_PER_SEQ) * mu.dims.n_layer
    assert traffic(mu, tiers, compute, "gpu", kv, RATES, parallel=32).offload_bytes == 0
    assert traffic(mu, *_placed(mu, lambda u: u.expert >= 0), "gpu", kv, RATES, parallel=32,
                   op_offload=False).offload_bytes == 0


@pytest.mark.parametrize("shape,on_cpu,measured", [
    # -ngl 99 -ncmoe 41: experts of the first 41 layers on the CPU
    ("qwen3-30b-a3b", lambda u: u.expert >= 0 and u.layer < 41, {1: 42.8, 4: 59.7, 16: 92.1, 32: 19.8}),
    ("llama3.3-70b", lambda u: u.layer < 66, {1: 2.24, 32: 6.51}),  # -ngl 14
])
def test_vanilla_batched_decode_as_measured(model, shape, on_cpu, measured):
    mu = model_units(model(shape))
    for b, tok_s in measured.items():
        assert predict(_vanilla(mu, on_cpu, b), RATES).decode_tok_s == pytest.approx(tok_s, rel=0.2), b


def test_the_planner_plans_for_the_batch(model):
    h = model("llama3.3-70b")
    plans = {b: plan_model(h, H200, gpu_mem="8GiB", ram="64GiB",
                           settings=PlanSettings(n_ctx=b * CTX_PER_SEQ, parallel=b)) for b in (1, 16, 32)}
    # batched CPU matmuls cost FLOPs, a streamed layer's bytes do not: more crosses the link as the batch grows
    # (streamed into slots, or from 32 tokens on copied by op offload from the pinned copies)
    crossing = {b: p.traffic.link_bytes + p.traffic.offload_bytes for b, p in plans.items()}
    assert crossing[1] < crossing[16] < crossing[32]
    assert plans[1].prediction.decode_tok_s < plans[16].prediction.decode_tok_s < plans[32].prediction.decode_tok_s
    for b, plan in plans.items():
        assert plan.prediction.parallel == plan.traffic.parallel == b
        # the same placement evaluated for one sequence is never better than the plan made for it
        placed = [plan.placement(u.tensors[0]) for u in model_units(h).units]  # dense: a unit a tensor
        one = predict(traffic(model_units(h), [t.tier for t in placed], [t.compute for t in placed], plan.kv_tier,
                              plan.kv_bytes, plan.rates, plan.n_ubatch), plan.rates)
        assert one.decode_tok_s <= plans[1].prediction.decode_tok_s * 1.001
    again = Plan.from_json(plans[32].to_json())
    assert again.traffic == plans[32].traffic and again.prediction.parallel == 32


def test_at_32_sequences_every_weight_off_the_gpu_streams_and_the_bound_is_the_links(model):
    from hypura.speed.bound import bound

    h = model("llama3.3-70b")
    plan = plan_model(h, H200, gpu_mem="8GiB", ram="64GiB", settings=PlanSettings(n_ctx=32 * CTX_PER_SEQ, parallel=32))
    # the H200 run of this plan: 38.7 tok/s against vanilla's 7.7 (bench/RESULTS.md); the CPU's batched
    # matmuls beside streaming cost more than the link: every weight off the GPU crosses it, streamed into slots
    # or copied by op offload from its pinned copy
    off_gpu = sum(t.nbytes for t in plan.tensors if t.tier != "gpu" and t.name != "token_embd.weight")
    t = plan.traffic
    assert t.host_pinned and t.link_bytes + t.offload_bytes == pytest.approx(off_gpu, rel=1e-6)
    assert plan.prediction.decode_limit in ("link", "offload")
    assert plan.prediction.decode_tok_s <= 32 * plan.rates.link / off_gpu
    if not t.offload_bytes:  # bench's bound counts streamed bytes on the link
        b = bound(h, plan, None, 32)
        assert b["limit"] == "link" and plan.prediction.decode_tok_s <= b["decode_tok_s"]


def test_op_offload_at_the_links_rate_from_pinned_experts(model):
    """MoE at 32 sequences: from pageable memory op offload's copies of the selected experts are slower than
    the CPU (vanilla with mmap at 32 sequences: 19.8 tok/s, 92.1 at 16); a plan that holds its CPU experts pinned
    copies them at the link's rate and keeps op offload on (vanilla's -lm none: 126.5 at 32 on an H100)."""
    h = model("qwen3-30b-a3b")
    plan = plan_model(h, H200, gpu_mem="4GiB", ram="64GiB", settings=PlanSettings(n_ctx=32 * CTX_PER_SEQ, parallel=32))
    assert plan.traffic.op_offload and plan.traffic.host_pinned and plan.traffic.offload_bytes > 0
    vanilla = predict(_vanilla(model_units(h), lambda u: u.expert >= 0 and u.layer < 41, 32), RATES)
    assert plan.prediction.decode_tok_s >= 3 * vanilla.decode_tok_s
    small = plan_model(h, H200, gpu_mem="4GiB", ram="64GiB", settings=PlanSettings(n_ctx=16 * CTX_PER_SEQ, parallel=16))
    assert small.traffic.op_offload  # below 32 tokens op offload never runs in decode: prefill keeps it


def test_the_expert_cache_is_a_one_sequence_plan(model):
    h = model("qwen3-30b-a3b")
    batched = plan_model(h, H200, gpu_mem="6GiB", ram="64GiB", settings=PlanSettings(n_ctx=4 * CTX_PER_SEQ, parallel=4))
    assert batched.expert_slots == 0 and batched.mode != "expert-cache"
