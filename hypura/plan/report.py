"""Plans and profiles as text a person reads: tables, a per-layer map, the prediction."""

from __future__ import annotations


from collections import Counter
from pathlib import Path

from hypura.modelfile import ModelHeader
from hypura.plan.budget import fmt_size
from hypura.plan.cost import CPU, DISK, GPU, RAM
from hypura.plan import knobs
from hypura.plan.expected import Expected
from hypura.plan.microbatch import experts_per_call
from hypura.plan.plan import TIERS, Plan
from hypura.plan.pools import paged_by_expert
from hypura.plan.steps import turn_seconds
from hypura.profile.machine import MachineProfile

_LETTER = {GPU: "G", RAM: "R", DISK: "D"}


def _gbs(bw: float | None) -> str:
    return "-" if not bw else f"{bw / 1e9:.1f} GB/s" if bw < 1e12 else f"{bw / 1e12:.2f} TB/s"


def _flops(f: float) -> str:
    return f"{f / 1e12:.1f} TFLOP/s" if f >= 1e12 else f"{f / 1e9:.1f} GFLOP/s"


def _table(rows: list[list[str]], align: str = "") -> list[str]:
    """Columns padded to their widest cell; `align` per column, l or r (default: first l, rest r)."""
    align = align or "l" + "r" * (len(rows[0]) - 1)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(r, widths, align)).rstrip()
            for r in rows]


def describe_profile(p: MachineProfile) -> list[str]:
    h, d = p.host, p.disk
    rows = [["", "capacity", "rate", "how"],
            ["RAM", f"{fmt_size(h.ram_available)} free of {fmt_size(h.ram_total)}", _gbs(h.ram_copy_bw),
             "numpy copy, bytes copied/s"],
            ["CPU decode", f"{h.cores} cores, {h.threads} threads", _gbs(p.cpu.decode_bw), "see [cpu] below"],
            ["CPU prefill", "", _flops(p.cpu.prefill_flops), ""],
            ["disk", f"{d.fs_type} at {d.path}", _gbs(d.read_bw), "see [disk] below"]]
    rows += [[f"  {t} thread(s)", f"{d.request_bytes >> 20} MiB requests", _gbs(bw), ""] for t, bw in d.by_threads]
    rows += [[f"  {t} thread(s)", f"{d.random_request_bytes >> 20} MiB at random", _gbs(bw),
              "" if i else "as experts are read"] for i, (t, bw) in enumerate(d.random_by_threads)]
    for g in p.gpus:
        kind = "unified" if g.unified else "discrete"
        rows += [[f"GPU {g.index}", f"{fmt_size(g.mem_free)} free of {fmt_size(g.mem_total)} ({kind})", "",
                  f"{g.name}: {g.description}"],
                 ["  h2d pinned", "", _gbs(g.h2d_pinned_bw), "tensor_set from a host-buffer-type buffer"],
                 ["  h2d pageable", "", _gbs(g.h2d_pageable_bw), "tensor_set from numpy memory"],
                 ["  device copy", "", _gbs(g.d2d_bw), "tensor_copy, bytes read + written/s"],
                 ["  decode", "", _gbs(g.decode_bw), "see [gpu] below"],
                 ["  prefill", "", _flops(g.prefill_flops), ""]]
    out = [f"machine profile {p.key} ({p.created}, measured in {p.seconds:.1f} s)", f"CPU: {h.cpu}"]
    out += _table(rows, "llrl")
    out += [f"[cpu] {p.cpu.method}", f"[disk] {d.method}"] + [f"[gpu] {g.method}" for g in p.gpus]
    out += [f"note: {n}" for n in p.notes]
    return out


def layer_map(plan: Plan, per_line: int = 50) -> list[str]:
    """One letter per block: its dominant tier, upper case if the whole block is there."""
    letters = []
    for row in plan.layer_bytes():
        total = sum(row.values())
        top = max(TIERS, key=lambda t: row[t])
        ch = _LETTER[top]
        letters.append(ch if total == 0 or row[top] == total else ch.lower())
    lines = []
    for start in range(0, len(letters), per_line):
        lines.append(f"  {start:>4}  {''.join(letters[start:start + per_line])}")
    return lines


def _cpu_staging(plan: Plan) -> str:
    """A CPU plan's staging as the runtime splits it (staging.staging_slots): the host pool's slots for dense disk
    layers, the rest the pager's."""
    dense: Counter = Counter()
    for t in plan.tensors:
        if t.tier == DISK and not paged_by_expert(t):
            dense[t.layer] += t.nbytes
    slots = min(plan.staging_slots, len(dense))
    host = slots * max(dense.values(), default=0)
    pool = (f"{slots} slot{'s' if slots > 1 else ''} of {fmt_size(host // slots)} for dense disk layers" if slots
            else "no dense disk layers")
    return (f"RAM staging {fmt_size(plan.memory[RAM]['staging'])}: {pool}, "
            f"{fmt_size(plan.memory[RAM]['staging'] - host)} for paged experts")


def _staged_experts(plan: Plan, header: ModelHeader | None) -> str:
    """What the staging holds of one micro-batch's selections, where the CPU computes paged experts (microbatch.py)."""
    k = int(header.get("expert_used_count") or 0) if header is not None else 0
    if not k or plan.rates.has_gpu:
        return ""
    n_expert = max(len(t.experts) for t in plan.tensors)
    per_call = min(n_expert, experts_per_call(k, plan.n_ubatch, False))
    return (f"one micro-batch's selections (up to {per_call} of a layer's {n_expert} experts: {k} a token, "
            f"micro-batch {plan.n_ubatch}) and ")


def describe_plan(plan: Plan, header: ModelHeader | None = None, profile: MachineProfile | None = None,
                  assumed: Expected | None = None) -> list[str]:
    out = []
    name = Path(plan.model).name
    if header is not None:
        types = Counter(t.ggml_type.name for t in header.tensors).most_common(3)
        out.append(f"model    {name}: {plan.arch}, {plan.n_layer} layers, {fmt_size(header.weight_bytes)} of weights "
                   f"({', '.join(f'{k} x{v}' for k, v in types)})")
    if profile is not None:
        gpu = profile.gpu
        gpu_text = f"{gpu.description} {fmt_size(gpu.mem_total)}{' unified' if gpu.unified else ''}" if gpu else "no GPU"
        out.append(f"machine  {profile.key}: {gpu_text}, RAM {fmt_size(profile.host.ram_total)}, "
                   f"disk {_gbs(profile.disk.read_bw)}"
                   + (f" ({_gbs(profile.disk.random_read_bw)} at random)" if profile.disk.random_read_bw else ""))
    out.append(f"context  {plan.n_ctx} tokens: KV cache {fmt_size(plan.kv_bytes)} on {plan.kv_tier}; "
               f"micro-batch {plan.n_ubatch}")
    out.append(f"mode     {plan.mode}  ({plan.solver}: {plan.config})")
    if plan.why:
        out.append(f"chosen   {plan.why}")
    out.append("")
    rows = [["tier", "budget", "weights", "kv", "buffers", "used", "tensors", "experts"]]
    count = plan.tensors_by_tier()
    for tier in TIERS:
        m = plan.memory[tier]
        bufs = sum(v for k, v in m.items() if k not in ("budget", "weights", "kv"))
        budget = "-" if tier == DISK else fmt_size(m["budget"]) + (" (shared)" if plan.unified and tier == RAM else "")
        used = "-" if tier == DISK else fmt_size(plan.used(tier) + (plan.used(GPU) if plan.unified and tier == RAM else 0))
        rows.append([tier, budget, fmt_size(m["weights"]), fmt_size(m.get("kv", 0)), fmt_size(bufs), used,
                     str(count[tier]), str(plan.expert_cache[tier])])
    out += _table(rows)
    out.append("")
    pool = (f"{plan.pool_slots} GPU slots, {fmt_size(plan.memory[GPU]['pool'])} (largest "
            f"{fmt_size(plan.pool_slot_bytes)})" if plan.pool_slots else "no GPU pool")
    staging = (f"{plan.staging_slots} RAM slots for disk layers, {fmt_size(plan.memory[RAM]['staging'])} (largest "
               f"{fmt_size(plan.staging_slot_bytes)})" if plan.staging_slots else "no disk slots")
    if plan.staging_slots and not plan.rates.has_gpu and any(paged_by_expert(t) for t in plan.tensors):
        staging = _cpu_staging(plan)
    out.append(f"streams  {pool}; {staging}; prefetch depth {plan.prefetch_depth}")
    ram = plan.memory[RAM]
    if ram.get("process") or ram.get("runtime"):
        what = ("the CUDA runtime, Python, libraries and llama.cpp's heap (knobs.GPU_PROCESS_RAM)" if ram.get("runtime")
                else "Python, libraries and llama.cpp's heap (knobs.PROCESS_RAM)")
        out.append(f"overhead {fmt_size(ram.get('process', 0) + ram.get('runtime', 0))} of the RAM budget reserved "
                   f"for the process itself: {what}")
    if plan.routing_tokens:
        out.append(f"routing  expert frequencies from {plan.routing_tokens} tokens that earlier runs recorded "
                   f"(`hypura routing MODEL --reset` forgets them)")
    if plan.expert_slots:
        out.append(f"experts  cache of {plan.expert_slots} GPU slots a MoE layer, every expert in RAM; "
                   f"predicted at a hit rate of {plan.expert_hit_rate:.2f}")
    if plan.expert_cache[DISK]:
        staged = _staged_experts(plan, header)
        held = f"the RAM staging above holds {staged}" if staged else "the RAM slots above hold "
        out.append(f"experts  {plan.expert_cache[DISK]} on disk, read when a router selects them; {held}the "
                   "recently read ones")
    out += describe_prediction(plan)
    out += describe_expected(assumed) if assumed is not None else []
    out += describe_steps(plan)
    out.append("")
    out.append("layers   (G gpu, R ram, D disk; lower case: the block is split across tiers)")
    out += layer_map(plan)
    return out


def describe_prediction(plan: Plan) -> list[str]:
    pr = plan.prediction
    unit = "token" if pr.parallel == 1 else "step"  # a step: one token of each sequence
    rows = [["  path", f"bytes/{unit}", f"s/{unit}", "at predicted rate"]]
    rates = pr.gbps()
    for path in ("gpu", "cpu", "offload", "link", "disk"):  # offload: op offload's pageable copies
        b = pr.bytes_per_token.get(path, 0)
        if b:
            rows.append([f"  {path}", fmt_size(b), f"{pr.seconds[path]:.4f}", f"{rates[path]:.1f} GB/s"])
    rows.append(["  fixed", "", f"{pr.seconds['overhead']:.4f}", "per-layer costs and CPU/GPU hand-offs"])
    rate = lambda x: f"{x:.0f}" if x >= 100 else f"{x:.3g}"  # noqa: E731
    return ([f"predict  {'decode' if pr.parallel == 1 else f'aggregate decode of {pr.parallel} sequences'} "
             f"{rate(pr.decode_tok_s)} tok/s (limited by {pr.decode_limit}), "
             f"prefill {rate(pr.prefill_tok_s)} tok/s (limited by {pr.prefill_limit})",
             *([f"         one sequence alone {rate(plan.one_decode_tok_s)} tok/s (its own step's path, its own KV "
                "cells): a plan for several sequences weighs its chat turn too"] if pr.parallel > 1 and
               plan.one_decode_tok_s else []),
             f"         a chat turn ({knobs.OBJECTIVE_PROMPT_TOKENS} prompt + {knobs.OBJECTIVE_DECODE_TOKENS} "
             f"generated tokens, what plans minimise): {turn_seconds(pr):.1f} s",
             describe_prompts(plan)] + _table(rows))


def describe_expected(e: Expected) -> list[str]:
    """The hit rates the prediction assumes per tier and the bound it stands beside (plan/expected.py)."""
    out = []
    if e.expert_hits:
        shares = ", ".join(f"{tier} {share:.2f}" for tier, share in e.expert_hits.items())
        out.append(f"hits     a token's routed-expert reads served by each tier, as predicted ({e.routing}): {shares}")
    rate = f"{e.bound_tok_s:.3g}" if e.bound_tok_s < float("inf") else "unbounded"
    of = f"; the prediction is {e.decode_tok_s / e.bound_tok_s:.2f} of it" if 0 < e.bound_tok_s < float("inf") else ""
    out.append(f"bound    decode {rate} tok/s if each path moved only its bytes at the profile's rate, all "
               f"overlapping (limited by {e.bound_limit}: {e.bound_seconds[e.bound_limit]:.4f} s){of}")
    return out


def describe_prompts(plan: Plan) -> str:
    """A prompt's time by its length: micro-batches of the plan's size, each at the predicted prefill rate."""
    pr = plan.prediction
    times = ", ".join(f"{n}: {pr.prompt_seconds(n):.2f} s" for n in (512, 2048, 8192) if n <= plan.n_ctx)
    grown = ", grown from llama.cpp's 512: fewer weight copies a token" if plan.n_ubatch > knobs.N_UBATCH else ""
    return (f"         prompts in micro-batches of {plan.n_ubatch} ({pr.prefill_limit}-bound{grown}): "
            f"{times or 'none fits the context'}")


def describe_steps(plan: Plan) -> list[str]:
    """Per step size: which path the RAM layers take (streamed into GPU slots, or computed by the CPU where
    they are) and the predicted speed; a step is a decode step of that many sequences, a verification pass of
    that many drafted tokens, or a prompt chunk."""
    if not plan.step_paths:
        return []
    ram_layers = {t.layer for t in plan.tensors if t.tier == RAM and not t.experts and 0 <= t.layer < plan.n_layer}
    stacks = [t for t in plan.tensors if t.experts and t.name in plan.dual]
    rows = [["  tokens", "RAM layers streamed", "computed by the CPU"]
            + (["expert layers streamed"] if stacks else []) + ["tok/s", "s/step"]]
    n_stacked = len({t.layer for t in plan.tensors if t.experts and set(t.experts) == {RAM}})  # may stream
    first = None  # the smallest step that streams expert stacks
    for k, names, rate in plan.step_paths:
        streamed = {plan.placement(n).layer for n in names if not plan.placement(n).experts}
        on_cpu = {t.layer for t in plan.tensors if t.layer in ram_layers and t.tier == RAM and not t.experts
                  and plan.compute_at(t, k) == CPU}
        experts = {t.layer for t in stacks if t.name in names}
        if experts and first is None:
            first = _smallest_step(plan, k)
        rows.append([f"  {k}", str(len(streamed)), str(len(on_cpu))]
                    + ([f"{len(experts)} of {n_stacked}"] if stacks else []) + [f"{rate:.3g}", f"{k / rate:.3f}"])
    note = ([f"         experts streamed from {first} tokens: a layer's stacks whole, every expert in RAM; smaller "
             "steps compute the routed ones on the CPU"] if first is not None else [])
    return (["paths    each step's own: RAM layers the link streams into GPU slots, or the CPU computes in place "
             "(a layer split between them counts in both)"] + note + _table(rows))


def _smallest_step(plan: Plan, k: int) -> int:
    """The fewest tokens a step takes the path of table row `k` with: one more than the row before."""
    sizes = [size for size, _, _ in plan.step_paths]
    i = sizes.index(k)
    return sizes[i - 1] + 1 if i else 1


def describe_tensors(plan: Plan) -> list[str]:
    rows = [["tensor", "tier", "compute", "bytes", "experts (gpu/ram/disk)"]]
    for t in plan.tensors:
        experts = ""
        if t.experts:
            c = Counter(t.experts)
            experts = "/".join(str(c.get(tier, 0)) for tier in TIERS)
        rows.append([t.name, t.tier, t.compute, fmt_size(t.nbytes), experts])
    return _table(rows)
