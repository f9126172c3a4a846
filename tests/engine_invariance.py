"""Greedy output of each sequence in a batch against its output alone, through the engine, for one model
under a resident and a streamed plan. Run in a fresh interpreter (tests/test_engine_batch.py) with
GGML_CPU_TILED_MM_FORCE=1, which llama.cpp reads once per process (docs/engine.md: what equality needs).

    python tests/engine_invariance.py MODEL KIND      # KIND: dense | moe; prints JSON, one entry per case
"""

from __future__ import annotations

import dataclasses
import json
import sys

import hypura  # noqa: F401  first: loads our library

from hypura.engine import EngineConfig, SamplingParams, load
from hypura.plan import PlanSettings, RateOverrides, plan_model
from hypura.profile import machine_profile, resolve_profile

PROMPTS = ["The capital of France is", "def fib(n):\n    ", "Once upon a time, in a land far away, there lived",
           "1, 2, 3, 4, 5,", "A plan decides where every tensor lives: GPU memory, pinned RAM or disk. " * 3]
N_GEN = 16
PARALLEL = 4
N_CTX_PER_SEQ = 256


def streamed_dense(path):
    """Every third layer on disk, read into one host-pool slot each time it runs (tests/test_streaming.py)."""
    plan = plan_model(path, machine_profile(), ram="4GiB", settings=PlanSettings(n_ctx=PARALLEL * N_CTX_PER_SEQ))
    tensors = tuple(dataclasses.replace(t, tier="disk") if t.layer % 3 == 0 else t for t in plan.tensors)
    return dataclasses.replace(plan, tensors=tensors, staging_slots=1, prefetch_depth=0)


def paged_moe(path):
    """A CPU plan with the odd experts of every stacked expert tensor on disk (tests/test_expert_paging.py)."""
    plan = plan_model(path, resolve_profile("h200-design"), overrides=RateOverrides(no_gpu=True))

    def with_disk(t):
        if not t.experts:
            return t
        experts = tuple("disk" if e % 2 else "ram" for e in range(len(t.experts)))
        return dataclasses.replace(t, tier="disk", experts=experts)

    return dataclasses.replace(plan, tensors=tuple(map(with_disk, plan.tensors)))


def together(engine, prompts):
    """All prompts submitted at once: they share every step, from the first prompt step on."""
    greedy = SamplingParams(max_tokens=N_GEN, temperature=0.0, ignore_eos=True)
    requests = [engine.submit(p, greedy) for p in prompts]
    return [list(r.result(120).tokens) for r in requests]


def staggered(engine, prompts):
    """Continuous batching: sequences of different lengths; each next one joins when the previous one has
    generated a few tokens, and short ones leave while the others run."""
    out, requests, started = {}, [], []
    for i, p in enumerate(prompts):
        params = SamplingParams(max_tokens=N_GEN - 4 * (i % 3), temperature=0.0, ignore_eos=True)
        if requests:  # join mid-run: wait for three tokens of the one before
            events = requests[-1].events(timeout=120)
            for _ in range(3):
                next(events, None)
        requests.append(engine.submit(p, params))
        started.append(params)
    for i, r in enumerate(requests):
        out[i] = list(r.result(120).tokens)
    return [out[i] for i in range(len(prompts))], started


def run_case(path, plan, unified: bool) -> dict:
    llm, engine = load(path, parallel=PARALLEL, n_ctx_per_seq=N_CTX_PER_SEQ, plan=plan, n_threads=1,
                       n_threads_batch=1, config=EngineConfig(prefix_cache=not unified),
                       param_overrides={"context_params": {"kv_unified": unified},
                                        "model_params": {"use_extra_bufts": False}})
    try:
        prompts = [engine.tokenize(p) for p in PROMPTS]
        if unified:
            batch, alone = together(engine, prompts[:PARALLEL]), None
            alone = [together(engine, [p])[0] for p in prompts[:PARALLEL]]
        else:
            batch, params = staggered(engine, prompts)
            # last first: each finds its prompt still cached in the slot it ran in (an earlier one's KV is reused)
            alone = [list(engine.submit(p, sp).result(120).tokens) for p, sp in zip(prompts[::-1], params[::-1])][::-1]
        stats = llm.stats()
        m = engine.metrics()
    finally:
        engine.close()
        llm.close()
    return {"equal": batch == alone, "batch": batch, "alone": alone, "cached_tokens": m["cached_tokens"],
            "streamed_bytes": sum(stats.get("stream", {}).get("bytes", {}).values()),
            "paged_reads": stats.get("expert_paging", {}).get("reads", 0)}


def main(path: str, kind: str) -> None:
    streamed = paged_moe(path) if kind == "moe" else streamed_dense(path)
    cases = {}
    for placement, plan in (("resident", None), ("streamed", streamed)):
        for unified in (True, False):
            name = f"{placement}-{'unified-together' if unified else 'split-staggered'}"
            cases[name] = run_case(path, plan, unified)
    print(json.dumps(cases))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
