"""`hypura bench MODEL --parallel 1,4,16,32`: the engine's aggregate prefill and decode, measured as
llama-batched-bench measures them (tools/batched-bench, is_pp_shared 0): B sequences of npp random
prompt tokens each go through one step (llama.cpp splits it into n_ubatch micro-batches), then ntg
steps of one token per sequence; prefill tok/s = B*npp / prefill time, aggregate decode tok/s =
B*ntg / decode time. Each size gets a warm-up run, then r runs (median and spread), beside the bound.

The bound: a decode step reads every weight once whatever the batch (an MoE layer: the union of the
experts its B tokens select), so B tokens cost one pass of streamed bytes over the measured rates, and
the bound grows with B until compute, which this bound leaves out, takes over (bound.py). Beside it,
with a plan, the cost model's prediction of the plan's placement at each size (plan/cost.py: compute
FLOPs, op offload's copies and the experts a batch touches included; the plan itself was made for the
largest size)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Optional

from hypura.engine.config import EngineConfig
from hypura.engine.engine import Engine
from hypura.engine.loader import engine_llama_kwargs
from hypura.engine.types import SamplingParams
from hypura.errors import HypuraError
from hypura.speed.bound import run_bound
from hypura.speed.single import spread

RUN_TIMEOUT_S = 3600.0  # one run's requests; a run that long on any plan means a stuck engine


@dataclass(frozen=True)
class BatchBenchSettings:
    n_prompt: int = 128  # npp: prompt tokens per sequence
    n_gen: int = 16  # ntg: decode steps per sequence, after the prefill step
    parallel: tuple[int, ...] = (1, 4, 16, 32)
    repeats: int = 3
    seed: int = 0
    n_threads: int = 0  # as reported (the Llama was made with them)

    def __post_init__(self):
        if self.n_prompt < 1 or self.n_gen < 0 or self.repeats < 1 or not self.parallel or min(self.parallel) < 1:
            raise HypuraError("batched bench: want -p >= 1, -n >= 0, -r >= 1 and sequence counts >= 1")

    @property
    def n_ctx_per_seq(self) -> int:
        return self.n_prompt + self.n_gen + 1  # the prompt, the first token, then ntg decoded ones

    def llama_kwargs(self, **kwargs) -> dict:
        """hypura.loaded.Ask.of keywords for the largest batch: every prompt fits one step, micro-batches of 512
        tokens (llama-batched-bench's -ub default)."""
        top = max(self.parallel)
        kwargs.setdefault("n_ubatch", 512)
        return engine_llama_kwargs(top, self.n_ctx_per_seq, n_batch=top * self.n_prompt, **kwargs)


def _run(llm, s: BatchBenchSettings, b: int, n_gen: int, rng: random.Random) -> dict:
    """One run of b sequences on a fresh engine: the requests are queued before it starts, so the first
    step carries every prompt."""
    engine = Engine(llm, EngineConfig(parallel=b, max_queue=b, step_tokens=b * s.n_prompt, prefix_cache=False))
    params = SamplingParams(max_tokens=n_gen + 1, temperature=0.0, ignore_eos=True)
    try:
        requests = [engine.submit([rng.randrange(engine.n_vocab) for _ in range(s.n_prompt)], params)
                    for _ in range(b)]
        llm.stats(reset=True)
        t0 = time.perf_counter()
        engine.start()
        results = [r.result(RUN_TIMEOUT_S) for r in requests]
        wall = time.perf_counter() - t0
        m = engine.metrics()
    finally:
        engine.close()
    failed = [r.error for r in results if r.finish_reason != "length"]
    if failed:
        raise HypuraError(f"a batched run failed: {failed[0]}")
    pre, dec, llama = m["prefill"], m["decode"], m["llm"]
    return {"prefill_tok_s": pre["tok_s"], "decode_tok_s": dec["tok_s"], "prefill_steps": pre["steps"],
            "decode_steps": dec["steps"], "prefill_s": pre["seconds"], "decode_s": dec["seconds"], "wall_s": wall,
            # llama_decode and synchronize alone: the rest of a step is the engine's batching and sampling
            "llama_prefill_s": llama["prefill"]["seconds"], "llama_decode_s": llama["decode"]["seconds"],
            "stats": llama}


def run_batch_bench(llm, plan, s: BatchBenchSettings, rates=None, progress=lambda msg: None) -> dict:
    """plan: the Llama's (None: llama.cpp's placement); rates: the machine's, for the bound without one."""
    rng = random.Random(s.seed)
    sizes = []
    for b in s.parallel:
        progress(f"{b} sequences: warm-up")
        _run(llm, s, b, min(s.n_gen, 2), rng)
        runs = []
        for i in range(s.repeats):
            runs.append(_run(llm, s, b, s.n_gen, rng))
            progress(f"{b} sequences, run {i + 1}/{s.repeats}: prefill {runs[-1]['prefill_tok_s']:.1f} tok/s, "
                     f"decode {runs[-1]['decode_tok_s']:.2f} tok/s")
        bound = run_bound(llm, plan, rates, b)
        dec = spread([r["decode_tok_s"] for r in runs]) if s.n_gen else {}
        row = {"parallel": b, "prefill_tok_s": spread([r["prefill_tok_s"] for r in runs]), "decode_tok_s": dec,
               "llama_decode_tok_s": spread([b * s.n_gen / r["llama_decode_s"] for r in runs if r["llama_decode_s"]]),
               "bound": bound, "runs": [{k: v for k, v in r.items() if k != "stats"} for r in runs],
               "stats": runs[-1]["stats"]}
        if bound and dec:
            row["bound_ratio"] = dec["median"] / bound["decode_tok_s"]
        row["predicted"] = predicted(llm.header, plan, b)
        sizes.append(row)
    return {"settings": {**s.__dict__, "parallel": list(s.parallel)}, "sizes": sizes}


def predicted(header, plan, b: int) -> Optional[dict]:
    """The cost model's aggregate decode and prefill for the plan's placement at b sequences."""
    from hypura.plan import model_units, predict, traffic
    from hypura.plan.steps import kv_read

    if plan is None or plan.expert_slots:
        return None  # llama.cpp's placement, or an expert cache (a one-sequence prediction)
    mu = model_units(header)
    placed = [plan.placement(u.tensors[0]) for u in mu.units]
    tiers = [t.experts[u.expert] if u.expert >= 0 else t.tier for u, t in zip(mu.units, placed)]
    compute = [t.expert_compute[u.expert] if u.expert >= 0 and t.name not in plan.dual else plan.compute_at(t, b)
               for u, t in zip(mu.units, placed)]
    kv = kv_read(plan.kv_bytes, b, plan.prediction.parallel)  # b sequences' own cells
    pr = predict(traffic(mu, tiers, compute, plan.kv_tier, kv, plan.rates, plan.n_ubatch, b,
                         plan.traffic.op_offload, plan.traffic.host_pinned), plan.rates)
    return {"decode_tok_s": pr.decode_tok_s, "decode_limit": pr.decode_limit, "prefill_tok_s": pr.prefill_tok_s,
            "prefill_limit": pr.prefill_limit}
