"""The planner on header-only synthetic models (`hypura synth --sparse`): budgets, optimality
against the greedy baseline, monotonicity, determinism, infeasibility, and the seed machine's modes."""

from __future__ import annotations

import dataclasses
import itertools
import time

import pytest

from hypura.plan.experts import expected_hit_rate

from hypura.errors import HypuraError
from hypura.modelfile import read_header
from hypura.plan import (Plan, PlanSettings, RateOverrides, budgets_for, greedy, model_units, optimize,
                         parse_size, plan_model, predict, rates_for, traffic)
from hypura.plan import knobs
from hypura.plan.steps import turn_seconds
from hypura.profile import resolve_profile
from hypura.synth import writer

GiB = 1 << 30
SEED = resolve_profile("m1-max-32gb")
H200 = resolve_profile("h200-design")
MACHINES = {"seed": (SEED, RateOverrides()), "h200": (H200, RateOverrides()),
            "cpu-only": (H200, RateOverrides(no_gpu=True))}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """model(shape, ftype, layers) -> ModelHeader of a sparse synthetic GGUF, written once."""
    folder = tmp_path_factory.mktemp("models")
    cache = {}

    def get(shape: str, ftype: str = "q4_k_m", layers: int | None = None):
        key = (shape, ftype, layers)
        if key not in cache:
            path = folder / f"{shape}-{ftype}-{layers or 'all'}.gguf"
            writer.write_synth(shape, path, layers=layers, ftype=ftype, sparse=True)
            cache[key] = read_header(path)
        return cache[key]

    return get


def _tier_weights(plan: Plan) -> dict[str, int]:
    """Bytes per tier recomputed from the per-tensor placements (experts split by their tiers)."""
    out = {"gpu": 0, "ram": 0, "disk": 0}
    for t in plan.tensors:
        if t.experts:
            for tier in t.experts:
                out[tier] += t.nbytes // len(t.experts)
        else:
            out[t.tier] += t.nbytes
    return out


def _assert_within_budget(plan: Plan) -> None:
    w = _tier_weights(plan)
    gpu = w["gpu"] + sum(v for k, v in plan.memory["gpu"].items() if k not in ("budget", "weights"))
    ram = w["ram"] + sum(v for k, v in plan.memory["ram"].items() if k not in ("budget", "weights"))
    assert gpu <= plan.memory["gpu"]["budget"]
    assert ram + (gpu if plan.unified else 0) <= plan.memory["ram"]["budget"]
    # a process that uses the GPU holds host memory of its own (the CUDA runtime): the RAM budget covers it
    assert plan.memory["ram"]["runtime"] == (0 if plan.config.startswith("cpu only") else knobs.GPU_PROCESS_RAM)


@pytest.mark.parametrize("text,expected", [
    ("8GiB", 8 * GiB), ("512MiB", 512 << 20), ("24GB", 24 * 10**9), ("1.5G", int(1.5 * GiB)), ("0", 0),
    ("4096", 4096), (" 2 gib ", 2 * GiB), (3, 3),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "8 parsecs", "-1GiB", "GiB", "1.2.3G"])
def test_parse_size_rejects(text):
    with pytest.raises(HypuraError, match="bad size"):
        parse_size(text)


def test_units_cover_every_byte_and_expert(model):
    h = model("mixtral-8x7b", "q5_k_m", 4)
    mu = model_units(h)
    assert mu.weight_bytes == h.weight_bytes
    experts = [u for u in mu.units if u.expert >= 0]
    assert len(experts) == 4 * 8
    for layer in range(4):
        assert sum(u.p for u in experts if u.layer == layer) == pytest.approx(2.0)  # top-2
    assert [u for u in mu.units if u.host_only] == [u for u in mu.units if u.key == "token_embd.weight"]


def test_kv_cache_from_architecture(model):
    dims = model_units(model("llama3.3-70b", layers=2)).dims
    # 8 KV heads x (128 + 128) x f16 x 4096 cells, per layer; 80 layers make 1.25 GiB
    assert dims.kv_bytes_per_layer(4096) * 80 == int(1.25 * GiB)
    q3 = model_units(model("qwen3-30b-a3b", layers=2)).dims
    assert (q3.head_k, q3.n_head_kv, q3.n_expert, q3.n_expert_used) == (128, 4, 128, 8)


GRID_MODELS = [("llama3.3-70b", "q4_k_m", 6), ("mixtral-8x7b", "q5_k_m", 4), ("qwen3-30b-a3b", "q4_k_m", 4),
               ("qwen2.5-14b", "q4_k_m", 6), ("tiny-mixtral", "q8_0", None), ("tiny-llama", "q4_k_m", None)]


@pytest.mark.parametrize("shape,ftype,layers", GRID_MODELS)
@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_grid_budget_optimality_monotonicity(model, shape, ftype, layers, machine):
    """Over a grid of budgets: within budget, never worse than greedy, never slower with more memory
    (on the plans' objective: the time of a chat turn, prompt + decode, at the predicted rates)."""
    h = model(shape, ftype, layers)
    profile, overrides = MACHINES[machine]
    w = h.weight_bytes
    gpus = [0] if overrides.no_gpu else [0, w // 10, w * 3 // 10, w * 6 // 10, w * 13 // 10 + GiB]
    rams = [w // 5, w // 2, w + GiB, 2 * w + 2 * GiB]
    speed = {}
    for g, r in itertools.product(gpus, rams):
        try:
            best = plan_model(h, profile, gpu_mem=g, ram=r, overrides=overrides)
        except HypuraError as e:
            assert "no placement fits" in str(e)
            speed[g, r] = 0.0
            continue
        _assert_within_budget(best)
        try:
            base = plan_model(h, profile, gpu_mem=g, ram=r, overrides=overrides, solver="greedy")
        except HypuraError:
            pass  # the baseline may find nothing where the optimizer does
        else:
            _assert_within_budget(base)
            assert turn_seconds(best.prediction) <= turn_seconds(base.prediction) * (1 + 1e-9)
        speed[g, r] = 1.0 / turn_seconds(best.prediction)
    for r in rams:
        row = [speed[g, r] for g in gpus]
        assert all(b >= a * (1 - 1e-9) for a, b in zip(row, row[1:])), (r, row)
    for g in gpus:
        col = [speed[g, r] for r in rams]
        assert all(b >= a * (1 - 1e-9) for a, b in zip(col, col[1:])), (g, col)
    assert speed[gpus[-1], rams[-1]] > 0  # everything fits somewhere


def test_deterministic(model):
    h = model("qwen3-30b-a3b", layers=4)
    a = plan_model(h, H200, gpu_mem="1GiB", ram="4GiB")
    b = plan_model(h, H200, gpu_mem="1GiB", ram="4GiB")
    assert a.to_json() == b.to_json()


def test_infeasible_budgets_are_rejected_with_numbers(model):
    h = model("llama3.3-70b", layers=4)
    with pytest.raises(HypuraError, match=r"no placement fits: ram needs at least \d+MiB \(the smallest --ram that plans "
                                          r"this model here\) but has 64.0 MiB"):
        plan_model(h, H200, gpu_mem="0", ram="64MiB")
    with pytest.raises(HypuraError, match="disk streaming off"):
        plan_model(h, H200, gpu_mem="1GiB", ram="2GiB", disk=False)
    with pytest.raises(HypuraError, match="no GPU"):
        plan_model(h, dataclasses.replace(H200, gpus=()), gpu_mem="8GiB")


@pytest.mark.parametrize("shape,ftype,mode,tok_s", [
    ("qwen2.5-14b", "q4_k_m", "full-resident", (15, 40)),
    # some attention weights stream from disk, read ahead, so that RAM holds experts a router would wait for
    ("mixtral-8x7b", "q5_k_m", "mixed", (1, 6)),
    ("llama3.3-70b", "q4_k_m", "dense-ffn-streaming", (0.1, 1)),
])
def test_seed_machine_modes(model, shape, ftype, mode, tok_s):
    """The seed machine (M1 Max, 32 GB unified, ~21 GB GPU working set, NVMe 5.1 GB/s)."""
    plan = plan_model(model(shape, ftype), SEED)
    pr = plan.prediction
    print(f"{shape} {ftype}: {plan.mode}, decode {pr.decode_tok_s:.2f} tok/s ({pr.decode_limit}), "
          f"prefill {pr.prefill_tok_s:.0f} tok/s")
    assert plan.mode == mode
    assert tok_s[0] < pr.decode_tok_s < tok_s[1]
    _assert_within_budget(plan)


def _vanilla_exps_on_cpu(h, rates):
    """llama.cpp's `-ngl 99 -ot exps=CPU`: experts in RAM computed by the CPU, the rest on the GPU."""
    mu = model_units(h)
    tiers = ["ram" if u.role == "expert" or u.host_only else "gpu" for u in mu.units]
    compute = ["cpu" if t == "ram" else "gpu" for t in tiers]
    return predict(traffic(mu, tiers, compute, "gpu", mu.dims.kv_bytes_per_layer(4096) * mu.dims.n_layer, rates), rates)


def test_cost_model_matches_design_measurements(model):
    """DESIGN.md's vanilla llama.cpp runs on the H200, predicted from the H200 example profile."""
    rates = rates_for(H200)
    full = {"qwen2.5-14b": 149, "llama3.3-70b": 43.1}
    for shape, measured in full.items():
        assert plan_model(model(shape), H200).prediction.decode_tok_s == pytest.approx(measured, rel=0.15)
    ngl14 = plan_model(model("llama3.3-70b"), H200, gpu_mem="8GiB", solver="greedy")
    assert ngl14.prediction.decode_tok_s == pytest.approx(1.95, rel=0.15)
    assert _vanilla_exps_on_cpu(model("mixtral-8x7b", "q5_k_m"), rates).decode_tok_s == pytest.approx(8.46, rel=0.15)
    assert _vanilla_exps_on_cpu(model("qwen3-30b-a3b"), rates).decode_tok_s == pytest.approx(41.8, rel=0.15)


def test_prefill_beside_disk_weights_the_cpu_computes_runs_on_the_cpu(model):
    """The runtime turns llama.cpp's op offload off when CPU-computed weights come from disk (hooks fill
    them mid-graph): then a batch's CPU units are computed by the CPU, and their bytes stay off the link."""
    h = model("qwen3-30b-a3b")
    rates, mu = rates_for(H200), model_units(h)
    tiers = ["ram" if u.role == "expert" or u.host_only else "gpu" for u in mu.units]
    compute = ["cpu" if t == "ram" else "gpu" for t in tiers]
    kv = mu.dims.kv_bytes_per_layer(4096) * mu.dims.n_layer
    offloaded = traffic(mu, tiers, compute, "gpu", kv, rates)
    last = max(u.stage for u in mu.units if u.role == "expert")
    on_disk = ["disk" if u.role == "expert" and u.stage == last else t for u, t in zip(mu.units, tiers)]
    kept = traffic(mu, on_disk, compute, "gpu", kv, rates)
    assert offloaded.prefill_cpu_flops == 0 and offloaded.prefill_link_bytes > 0
    assert 0 < kept.prefill_cpu_flops < kept.prefill_flops and kept.prefill_link_bytes == 0
    cpu_s = kept.prefill_cpu_flops / rates.cpu_flops
    assert predict(kept, rates).prefill_tok_s < kept.n_ubatch / cpu_s  # the CPU's share bounds the batch
    # op offload copies the CPU's experts from pageable memory: that copy bounds the offloaded batch
    assert offloaded.prefill_offload_bytes == offloaded.prefill_link_bytes
    assert predict(offloaded, rates).prefill_limit == "link"


def test_disk_experts_are_timed_at_the_random_read_rate(model):
    """Decode reads experts where routers send it: random expert-sized reads, which a disk serves slower than
    the sequential 4 MiB requests of streamed layers. An older profile without that rate falls back."""
    h = model("qwen3-30b-a3b")
    mu = model_units(h)
    random_bw = H200.disk.read_bw / 2
    profile = dataclasses.replace(H200, disk=dataclasses.replace(H200.disk, random_read_bw=random_bw))
    rates, old = rates_for(profile), rates_for(H200)
    assert rates.expert_disk_read == random_bw and old.expert_disk_read is None
    tiers = ["disk" if u.role in ("expert", "attn") else "gpu" for u in mu.units]  # attention: dense, sequential
    compute = ["cpu" if t == "disk" else "gpu" for t in tiers]
    t = traffic(mu, tiers, compute, "gpu", 0, rates)
    experts = sum(u.p * u.nbytes for u, tier in zip(mu.units, tiers) if tier == "disk" and u.expert >= 0)
    assert 0 < t.expert_disk_bytes == pytest.approx(experts) and t.expert_disk_bytes < t.disk_bytes
    dense = t.disk_bytes - t.expert_disk_bytes
    assert predict(t, rates).seconds["disk"] == pytest.approx(dense / H200.disk.read_bw + experts / random_bw)
    assert predict(t, old).seconds["disk"] == pytest.approx(t.disk_bytes / H200.disk.read_bw)
    assert rates_for(profile, RateOverrides(disk_bw=3.0)).expert_disk_read == 3e9  # a given rate stands for both


def test_hybrid_beats_partial_offload(model):
    """Both paths at once: CPU on RAM layers while the link streams others (DESIGN.md: ~3.5 tok/s bound)."""
    from hypura.plan.search import _optimize_candidates
    from hypura.plan.solve import _Problem

    h = model("llama3.3-70b")
    mu = model_units(h)
    candidates = _optimize_candidates(_Problem(mu, budgets_for(H200, "8GiB"), rates_for(H200), PlanSettings()))
    hybrid = min((s for s in candidates if getattr(s, "streams", False)), key=lambda s: s.turn_s)
    vanilla = plan_model(h, H200, gpu_mem="8GiB", solver="greedy")
    assert hybrid.slot_bytes > 0
    assert {"cpu", "gpu"} <= {c for c, t in zip(hybrid.compute, hybrid.tiers) if t == "ram"}
    # DESIGN.md hoped for 1.5x; with the hand-off cost measured under streaming (knobs.STREAM_SPLIT_S) and the
    # RAM the CPU and the link share (knobs.RAM_SHARED_HEADROOM) the model predicts less: the H100 measured
    # 1.10x (2.42 against -ngl 14's 2.19, bench/RESULTS.md)
    assert hybrid.prediction.decode_tok_s > 1.05 * vanilla.prediction.decode_tok_s
    assert hybrid.prediction.decode_tok_s < 3.5 * 1.1
    # llama.cpp's fill is weighed as llama.cpp runs it, its KV cache beside its GPU layers: whole CPU layers
    # beside a KV cache in RAM (flash attention off, every layer's attention on the CPU) are no candidate
    kept = plan_model(h, H200, gpu_mem="8GiB")
    assert "llama.cpp's kind of placement" in kept.why
    assert kept.pool_slots or kept.kv_tier == "gpu"


@pytest.mark.parametrize("shape", ["llama3.3-70b", "qwen3-30b-a3b"])
def test_solve_time(model, shape):
    mu = model_units(model(shape))
    for profile, gpu in ((H200, "8GiB"), (SEED, None)):
        budgets, rates = budgets_for(profile, gpu), rates_for(profile)
        t0 = time.perf_counter()
        optimize(mu, budgets, rates, PlanSettings())
        assert time.perf_counter() - t0 < 10.0  # ~0.3 s; a search gone exponential takes minutes (a shared CI core)


def test_plan_json_round_trip_and_tensor_lookup(model, tmp_path):
    h = model("qwen3-30b-a3b", layers=3)
    plan = plan_model(h, H200, gpu_mem="600MiB", ram="8GiB")
    again = Plan.load(plan.save(tmp_path / "plan.json"))
    assert again == plan and again.to_json() == plan.to_json()
    for t in h.tensors:
        assert again.tier_of(t.name) in ("gpu", "ram", "disk")
        if "_exps" in t.name:
            assert len(again.expert_tiers(t.name)) == 128
    with pytest.raises(HypuraError, match="not in the plan"):
        again.tier_of("blk.99.attn_q.weight")
    again.check_model(h)
    with pytest.raises(HypuraError, match="does not match"):
        again.check_model(model("qwen3-30b-a3b", layers=4))
    with pytest.raises(HypuraError, match="plan format"):
        Plan.from_json('{"version": 0}')


def test_cpu_only_machine(model):
    h = model("llama3.1-8b", layers=8)
    resident = plan_model(h, H200, overrides=RateOverrides(no_gpu=True))
    assert resident.mode == "full-resident" and _tier_weights(resident)["gpu"] == 0
    streamed = plan_model(h, H200, ram=h.weight_bytes * 115 // 100, overrides=RateOverrides(no_gpu=True))
    assert streamed.mode == "dense-ffn-streaming" and streamed.prediction.decode_limit == "disk"
    assert streamed.staging_slots == 3


def test_routing_statistics_put_popular_experts_higher(model):
    h = model("mixtral-8x7b", "q5_k_m", 2)
    freqs = {layer: [40, 1, 1, 1, 1, 1, 1, 30] for layer in range(2)}
    plan = plan_model(h, H200, gpu_mem="3GiB", ram="8GiB", expert_probs=freqs)
    rank = {"gpu": 0, "ram": 1, "disk": 2}
    for layer in range(2):
        tiers = plan.expert_tiers(f"blk.{layer}.ffn_up_exps.weight")
        assert rank[tiers[0]] <= min(rank[t] for t in tiers[1:7])
        assert rank[tiers[7]] <= min(rank[t] for t in tiers[1:7])
    with pytest.raises(HypuraError, match="routing statistics"):
        plan_model(h, H200, expert_probs={0: [1, 2]})


def test_greedy_is_a_layer_prefix(model):
    """The baseline offloads whole layers from the last one down, like -ngl."""
    h = model("llama3.1-8b", layers=8)
    sol = greedy(model_units(h), budgets_for(H200, "1GiB"), rates_for(H200))
    on_gpu = sorted({u.layer for u, t in zip(model_units(h).units, sol.tiers) if t == "gpu" and u.layer >= 0})
    assert on_gpu == list(range(8 - len(on_gpu), 8))


@pytest.mark.parametrize("ram", ["64GiB", "16GiB"])
def test_plan_reserves_the_slots_the_runtime_lays_out(model, ram):
    """The planner's pool and disk-slot memory is exactly what runtime/stream_layout.py assigns:
    layers round-robin over the slots in graph order, every slot as large as the largest layer (a layer
    may take any slot when a step's path changes)."""
    from collections import defaultdict

    from hypura.runtime.dense.stream_layout import GPU_POOL, HOST_POOL, StreamLayout

    # four sequences: streaming clearly ahead of llama.cpp's kind of placement (one is within the error)
    plan = plan_model(model("llama3.3-70b"), H200, gpu_mem="8GiB", ram=ram, settings=PlanSettings(parallel=4))
    layout = StreamLayout.of(plan, gpu=True)
    for pool, tier, part in ((GPU_POOL, "gpu", "pool"), (HOST_POOL, "ram", "staging")):
        per_layer = defaultdict(int)
        for s in layout.tensors.values():
            if s.pool == pool:
                per_layer[s.layer] += s.nbytes
        slots = {layout.layer_slot[(pool, layer)] for layer in per_layer}
        assert len(slots) * max(per_layer.values(), default=0) == plan.memory[tier][part] == layout.pool_bytes(pool)
    assert layout.tensors  # the budgets make it stream


def test_expert_cache_plans_when_it_predicts_faster_decode(model):
    """An MoE plan turns its GPU experts into cache slots when the cost model says decode gains: with
    routing concentrated on a few experts a layer (H200 rates), not with uniform routing, where misses
    over PCIe and a host round trip a layer lose to the CPU computing experts in RAM (as measured on
    the H200, bench/RESULTS.md), nor over a slow link. Experts never stream through layer slots: the
    runtime would copy whole stacked tensors."""
    from hypura.runtime.dense.stream_layout import StreamLayout

    h = model("qwen3-30b-a3b")
    settings = PlanSettings(n_ctx=256)
    layers = range(int(h.get("block_count")))
    hot = {layer: [1.0] * 16 + [0.005] * 112 for layer in layers}  # 16 experts take 97 % of the selections
    cached = plan_model(h, H200, gpu_mem="4GiB", ram="24GiB", settings=settings, expert_probs=hot)
    assert cached.mode == "expert-cache" and cached.expert_slots >= 16
    assert cached.expert_hit_rate == pytest.approx(expected_hit_rate(hot[0], cached.expert_slots))
    assert all(t.tier == "ram" and set(t.experts) == {"ram"} for t in cached.tensors if t.experts)
    assert cached.used("gpu") <= cached.memory["gpu"]["budget"]
    assert cached.used("ram") <= cached.memory["ram"]["budget"]
    static = greedy(model_units(h, hot), budgets_for(H200, "4GiB", "24GiB"), rates_for(H200), settings)
    assert cached.prediction.decode_tok_s > static.prediction.decode_tok_s
    again = Plan.from_dict(cached.to_dict())
    assert (again.expert_slots, again.expert_hit_rate) == (cached.expert_slots, cached.expert_hit_rate)

    uniform = plan_model(h, H200, gpu_mem="4GiB", ram="24GiB", settings=settings)
    slow_link = plan_model(h, H200, gpu_mem="4GiB", ram="24GiB", settings=settings, expert_probs=hot,
                           overrides=RateOverrides(link_bw=1))
    for plan in (uniform, slow_link):
        assert plan.expert_slots == 0
        assert not any(name.endswith("_exps.weight") for name in StreamLayout.of(plan, gpu=True).tensors)
