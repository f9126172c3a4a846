"""llama.cpp's kind of placement as a candidate of every plan, CPU weights pinned or as llama.cpp holds them, and
a prompt's micro-batch as large as pays (plan/solve.py `_pick`, plan/microbatch.py, plan/decision.py).

Nothing here is measured: synthetic headers of real shapes, the bundled H200 profile with the rates of the H100
host the issues describe (pinned 55.2 GB/s, pageable 10.3) and a CPU made fast or slow by hand."""

from __future__ import annotations

import dataclasses
import re

import pytest

from hypura.modelfile import read_header
from hypura.plan import PlanSettings, knobs, plan_model
from hypura.plan.auto import Fit
from hypura.plan.decision import Ask, Decision, Routing, decide
from hypura.plan.load_params import Host, load_params
from hypura.plan.microbatch import turn_with_long_prompt
from hypura.profile import resolve_profile
from hypura.profile.free import FreeMemory
from hypura.runtime.placement import TensorInfo, Tier
from hypura.runtime.plan_policy import homes_mapped, plan_policy
from hypura.runtime.dense.stream_layout import StreamLayout
from hypura.synth import writer

GiB = 1 << 30
DESIGN = resolve_profile("h200-design")


def host(cpu_bw: float, plain_share: float | None = 1.0):
    """The H100 host's links, a CPU that decodes at cpu_bw (and plain_share of it from the unrepacked layout)."""
    gpu = dataclasses.replace(DESIGN.gpu, h2d_pinned_bw=55.2e9, h2d_pageable_bw=10.3e9)
    cpu = dataclasses.replace(DESIGN.cpu, decode_bw=cpu_bw,
                              decode_bw_plain=None if plain_share is None else cpu_bw * plain_share)
    return dataclasses.replace(DESIGN, cpu=cpu, gpus=(gpu,) + DESIGN.gpus[1:])


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shapes")
    out = {}
    for shape in ("llama3.3-70b", "qwen3-30b-a3b"):
        writer.write_synth(shape, folder / f"{shape}.gguf", ftype="q4_k_m", sparse=True)
        out[shape] = read_header(folder / f"{shape}.gguf")
    return out


def held_gpu(gib: float) -> FreeMemory:
    """The GPU held by another process down to `gib` free, RAM plenty: the issues' no-flags runs."""
    return FreeMemory(gpu=int(gib * GiB), ram=100 * GiB, gpu_total=80 * GiB, ram_total=125 * GiB, source="test")


def budgets(header, profile, gpu_mem: str, n_ctx: int = 4096, n_ubatch: int = knobs.N_UBATCH):
    """The plan the decision makes within `gpu_mem` of GPU and 64 GiB of RAM (its micro-batch chosen there)."""
    ask = Ask(gpu_mem=gpu_mem, ram="64GiB", n_ctx=n_ctx, n_ubatch=n_ubatch)
    return decide(header, ask, None, profile, routing=Routing()).plan


def no_flags(header, profile, gib: float) -> Decision:
    return decide(header, Ask(fit=Fit()), held_gpu(gib), profile, routing=Routing())


def test_llamas_placement_is_kept_where_streaming_does_not_clearly_win(shapes):
    """The 70B with 8.5 GiB of the GPU free, no flags, beside a fast CPU (the H100 host's first-use rate, its
    unrepacked layout at 0.88 of the repacked one, as vanilla's q3 decode with -lm none against mmap): for one
    sequence llama.cpp's kind of placement runs (nothing streamed); for 16 sequences streaming wins clearly.
    A CPU whose unrepacked layout reads as fast gets its CPU weights pinned. The line says which."""
    h = shapes["llama3.3-70b"]
    fast = host(121e9, 0.88)
    one = no_flags(h, fast, 8.5)
    assert not one.fits  # it does not run as llama.cpp would place it whole
    assert not one.plan.pool_slots and one.plan.why.startswith("llama.cpp's kind of placement")
    assert "llama.cpp's kind" in one.line
    many = decide(h, Ask(fit=Fit(), parallel=16), held_gpu(8.5), fast, routing=Routing())
    assert many.plan.pool_slots and many.plan.why.startswith("streaming predicts")
    assert many.plan.prediction.decode_tok_s > 2 * one.plan.prediction.decode_tok_s
    # where the unrepacked layout reads as fast, CPU weights are pinned, streamed or in llama.cpp's fill (its
    # -lm none), whichever the turn prefers; streaming only for a gain beyond the cost model's error
    plain = no_flags(h, host(121e9, 1.0), 8.5)
    assert plain.plan.traffic.host_pinned
    gain = float(re.search(r"predicts (?:only )?(\d+)%", plain.plan.why).group(1)) / 100
    assert (gain >= knobs.STREAM_GAIN_MIN) == bool(plain.plan.pool_slots)


def test_moe_experts_pinned_for_prompts_where_the_cpu_reads_them_as_fast(shapes):
    """q3 at 4 GiB: with the unrepacked layout as fast as the repacked one, experts are held pinned (a prompt's
    selected experts cross at the link's rate, not pageable memory's), with a larger micro-batch; where the
    unrepacked layout is much slower, they stay as llama.cpp holds them."""
    h = shapes["qwen3-30b-a3b"]
    pinned = budgets(h, host(78e9, 1.0), "4GiB")
    kept = budgets(h, host(78e9, 0.5), "4GiB")
    assert pinned.traffic.host_pinned and not kept.traffic.host_pinned
    assert pinned.prediction.prefill_tok_s > 3 * kept.prediction.prefill_tok_s
    assert pinned.n_ubatch > knobs.N_UBATCH
    # the policy the loader hooks ask: RAM weights the CPU computes are deferred, to be homed in the mapped file
    # and pinned there (runtime/mapped_weights.py), GPU ones go to the GPU
    assert homes_mapped(pinned, StreamLayout.empty()) and not homes_mapped(kept, StreamLayout.empty())
    policy = plan_policy(pinned, StreamLayout.empty())
    for t in pinned.tensors[:60]:
        info = TensorInfo(name=t.name, ggml_type=0, shape=(), file_offset=0, nbytes=t.nbytes, file_idx=0,
                          layer=t.layer, default_tier=Tier.DEFAULT, default_buft="")
        want = (Tier.GPU, False) if t.tier == "gpu" else (Tier.HOST, True)
        assert (policy(info).tier, policy(info).defer) == want, t.name


def test_the_micro_batch_grows_only_where_it_pays(shapes):
    h, prof = shapes["qwen3-30b-a3b"], host(78e9, 1.0)
    base = budgets(h, prof, "4GiB", n_ubatch=1024 - 1)
    grown = budgets(h, prof, "4GiB")
    assert base.n_ubatch == 1023  # a micro-batch the caller chose stands
    assert grown.n_ubatch in knobs.MICROBATCH_CHOICES
    assert turn_with_long_prompt(grown) < turn_with_long_prompt(base)
    one = plan_model(h, prof, gpu_mem="4GiB", ram="64GiB", settings=PlanSettings(n_ctx=4096, n_ubatch=512))
    assert one.n_ubatch == knobs.N_UBATCH  # plan_model plans at the micro-batch given; the decision chooses
    # never bought with slower replies
    assert grown.prediction.decode_tok_s >= one.prediction.decode_tok_s * (1 - knobs.MICROBATCH_DECODE_TOLERANCE)
    # no larger than the context
    small = budgets(h, prof, "4GiB", n_ctx=768)
    assert small.n_ubatch == knobs.N_UBATCH
    # the whole model on the GPU: prompts are compute-bound, llama.cpp's micro-batch stays
    resident = budgets(h, prof, "40GiB")
    assert resident.n_ubatch == knobs.N_UBATCH


def test_the_decisions_micro_batch_reaches_llamas_context(shapes):
    h = shapes["qwen3-30b-a3b"]
    d = decide(h, Ask(gpu_mem="4GiB", ram="64GiB", n_ctx=4096), None, host(78e9, 1.0), routing=Routing())
    ub = d.plan.n_ubatch
    assert ub > knobs.N_UBATCH and d.params.fields()["context_params"]["n_ubatch"] == ub
    # llama.cpp's defaults are no choice: the plan's micro-batch, a batch at least as large
    machine = Host(gpu=True, cores=16, cpus=32)
    fields = lambda ask: load_params(d.plan, 4096, ask, machine).fields()["context_params"]  # noqa: E731
    assert (fields(Ask(n_ubatch=512, n_batch=512))["n_ubatch"], fields(Ask(n_ubatch=512, n_batch=512))["n_batch"]) \
        == (ub, ub)
    assert (fields(Ask(n_ubatch=512, n_batch=8192))["n_ubatch"], fields(Ask(n_ubatch=512, n_batch=8192))["n_batch"]) \
        == (ub, 8192)
    # a micro-batch the user chose stands
    assert "n_ubatch" not in fields(Ask(n_ubatch=256, n_batch=2048))




def test_the_micro_batch_counts_only_the_outputs_read(shapes):
    """llama.cpp's compute buffer holds logits for n_outputs_max rows: where the caller reads one a step, l70 at
    8 GiB beside the H100 host's CPU grows its micro-batch past 512 (its logits no longer take the GPU's
    weights) and the decision sets n_outputs_max; every row read (logits_all, a draft verified) sets none."""
    h, prof = shapes["llama3.3-70b"], host(68.1e9, 1.0)
    one = decide(h, Ask(gpu_mem="8GiB", ram="64GiB", n_ctx=10752, n_outputs=1), None, prof, routing=Routing())
    assert one.plan.n_ubatch > knobs.N_UBATCH
    assert one.params.fields()["context_params"]["n_outputs_max"] == 1
    every = decide(h, Ask(gpu_mem="8GiB", ram="64GiB", n_ctx=10752), None, prof, routing=Routing())
    assert "n_outputs_max" not in every.params.fields()["context_params"]
    # a caller's own n_outputs_max stands
    given = Ask(n_outputs=1, param_overrides={"context_params": {"n_outputs_max": 0}})
    assert "n_outputs_max" not in load_params(one.plan, 10752, given, Host(gpu=True, cores=16, cpus=32)).fields()[
        "context_params"]
    # the resident model stays at llama.cpp's micro-batch, nothing set
    resident = decide(h, Ask(gpu_mem="60GiB", ram="64GiB", n_ctx=4096, n_outputs=1), None, prof, routing=Routing())
    assert resident.plan.n_ubatch == knobs.N_UBATCH and "n_outputs_max" not in resident.params.fields()["context_params"]


def test_the_kv_cache_stays_on_the_gpu_where_it_fits(shapes):
    """A KV cache in RAM beside GPU layers puts attention on the CPU (a prompt's quadratic cost): the plan keeps the
    cache on the GPU wherever it fits there, and counts that attention where it does not (a server's 16 x 4096
    cells of l70 at 8 GiB), so a prompt is predicted slower than the same step's weights alone."""
    h, prof = shapes["llama3.3-70b"], host(68.1e9, 1.0)
    for n_ctx in (4096, 10752):
        assert budgets(h, prof, "8GiB", n_ctx=n_ctx).kv_tier == "gpu"
    server = decide(h, Ask(gpu_mem="8GiB", ram="64GiB", n_ctx=16 * 4096, parallel=16), None, prof,
                    routing=Routing()).plan
    assert server.kv_tier == "ram"
    weights_only = server.step_paths[-1][2] if server.step_paths else server.prediction.decode_tok_s
    assert server.prediction.prefill_tok_s < 0.8 * weights_only
    # the same plan's attention on the GPU costs a few percent of the prompt
    one = budgets(h, prof, "8GiB")
    assert one.prediction.prefill_tok_s > 0.9 * one.step_paths[-1][2]


def test_the_compute_buffer_holds_logits_for_the_outputs():
    from hypura.units import ModelDims

    d = ModelDims(arch="llama", n_layer=80, n_embd=8192, n_head=64, n_head_kv=8, head_k=128, head_v=128,
                  n_vocab=128256, n_ff=28672, n_expert=0, n_expert_used=0, n_ff_exp=28672)
    logits_row = 128256 * 4
    assert d.compute_buffer_bytes(4096, floor=0) - d.compute_buffer_bytes(4096, floor=0, n_outputs=1) \
        == 4095 * logits_row
    assert d.compute_buffer_bytes(512, floor=0, n_outputs=4096) == d.compute_buffer_bytes(512, floor=0)


def test_outputs_needed_by_caller():
    from hypura.plan.microbatch import outputs_needed

    assert outputs_needed({}, all_rows=False) == 1  # hypura-cli, hypura.Llama: the last token's logits
    assert outputs_needed({"n_seq_max": 17}, all_rows=False) == 17  # the engine: one a sequence a step
    assert outputs_needed({"n_seq_max": 17}, all_rows=True) == 0  # logits_all, a draft verified: every row
    assert outputs_needed({"embeddings": True}, all_rows=False) == 0
    assert outputs_needed({"n_seq_max": 4, "n_outputs_max": 0}, all_rows=False) == 0  # the caller's stands
