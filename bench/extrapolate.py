"""A model too large for this machine, measured on a layer subset and extrapolated to its full depth
(docs/large-moe.md).

    python3 -m bench.extrapolate budgets FULL.gguf SUBSET.gguf [--profile NAME] [--gpu-mem SIZE] --ram SIZE [-c N]
    python3 -m bench.extrapolate measure MODEL.gguf [--gpu-mem SIZE] [--ram SIZE] [-n 48] [-r 3] [-t 1] --json RUN.json
    python3 -m bench.extrapolate predict RUN.json ... --full FULL.gguf [--measured RUN.json ...] [--json OUT]

budgets: the --gpu-mem and --ram that give SUBSET (the first blocks of FULL, `hypura synth --layers`; FULL may be
a header-only `--sparse` file) the tier shares FULL has on the target machine: each budget less what the blocks
left out hold in that tier in FULL's plan (their average block's weights and KV cells). It prints both plans'
shares of the repeated blocks' bytes and of the routed-expert reads per tier, so a subset that plans otherwise
shows.

measure: decode one token at a time and time each, as `hypura bench` runs a model (the same plan from the same
budgets), keeping every token's seconds: on a machine shared with other work a run's mean takes in every spell the
process waited for a core, and the median token does not. Its JSON reads as `hypura bench --json`'s where predict
needs it (decode_tok_s per repeat, the decode's stall).

predict: `hypura bench --json` (or measure) runs of two or more subsets. A decode token's seconds are a fixed part (embeddings,
output head, the leading dense blocks, per-token overhead: in every subset alike) plus a cost per byte a token
reads from the repeated blocks: t = F + c x, x the bytes of each block's dense tensors plus k/E of its experts (the
quantizer gives some blocks more bits, so blocks differ: Q4_K_M's ffn_down is Q6_K in the first eighth and every
third block after), fitted by least squares on the runs' median tok/s, then evaluated at FULL's x.
With --measured (a run of FULL itself, where it fits), the error.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from hypura.modelfile import read_header
from hypura.plan import PlanSettings, model_units, parse_size, plan_model
from hypura.plan.expected import expected
from hypura.plan.plan import TIERS
from hypura.profile.store import machine_profile


def dense_lead(header) -> int:
    """Leading blocks with a dense FFN before the MoE ones (deepseek2's first 3): part of the fixed cost."""
    return int(header.get("leading_dense_block_count", 0) or 0)


def block_shares(plan, header) -> dict:
    """The repeated (MoE) blocks' average bytes per tier: weights, with the KV cache's cells of one block."""
    rows = plan.layer_bytes()[dense_lead(header):]
    out = {tier: sum(r[tier] for r in rows) / len(rows) for tier in TIERS}
    out[plan.kv_tier] += plan.kv_bytes / plan.n_layer
    return out


def scaled_budgets(full_plan, full_header, subset_header, gpu: int, ram: int) -> tuple[int, int]:
    """The subset's budgets: the full ones less what the left-out blocks hold in each tier."""
    left_out = full_header.n_layer - subset_header.n_layer
    per_block = block_shares(full_plan, full_header)
    return max(0, int(gpu - left_out * per_block["gpu"])), max(0, int(ram - left_out * per_block["ram"]))


def _shares(plan, header) -> dict:
    b = block_shares(plan, header)
    total = sum(b.values()) or 1
    hits = expected(plan, model_units(header)).expert_hits
    return {"block_bytes": {t: b[t] / total for t in TIERS}, "expert_reads": hits}


def budgets(args) -> dict:
    profile = machine_profile(args.profile)
    settings = PlanSettings(n_ctx=args.ctx_size)
    full_h, sub_h = read_header(args.full), read_header(args.subset)
    gpu = parse_size(args.gpu_mem) if args.gpu_mem else 0
    ram = parse_size(args.ram)
    full = plan_model(full_h, profile, gpu_mem=gpu, ram=ram, settings=settings)
    sub_gpu, sub_ram = scaled_budgets(full, full_h, sub_h, gpu, ram)
    sub = plan_model(sub_h, profile, gpu_mem=sub_gpu, ram=sub_ram, settings=settings)
    return {"full": {"model": args.full, "layers": full_h.n_layer, "gpu_mem": gpu, "ram": ram,
                     "decode_tok_s": full.prediction.decode_tok_s, **_shares(full, full_h)},
            "subset": {"model": args.subset, "layers": sub_h.n_layer, "gpu_mem": sub_gpu, "ram": sub_ram,
                       "decode_tok_s": sub.prediction.decode_tok_s, **_shares(sub, sub_h)},
            "bench": f"hypura bench {args.subset} " + (f"--profile {args.profile} " if args.profile else "")
                     + (f"--gpu-mem {sub_gpu >> 20}MiB " if gpu else "") + f"--ram {sub_ram >> 20}MiB -c {args.ctx_size}"}


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(F, c) of t = F + c x by least squares over (block bytes a token reads x, seconds a token t)."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        raise SystemExit("error: the runs need at least two subset depths")
    c = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - c * mx, c


def block_reads(header) -> float:
    """Bytes a decode token reads from the repeated blocks (dense tensors whole, experts at k/E)."""
    first = dense_lead(header)
    return sum(u.nbytes * u.p for u in model_units(header).units if u.layer >= first)


def pooled(paths: list[str], cpu_clock: bool = False) -> list[tuple[float, dict]]:
    """(block_reads, decode tok/s median/min/max) per model, over every run of it in `paths` (rounds of bench
    runs interleaved across the subsets: a busy spell of a shared machine then slows each depth alike)."""
    runs: dict[str, list[float]] = {}
    split: dict[str, list[tuple[float, float]]] = {}  # (seconds a token less the stall, stall) of each file's runs
    for path in paths:
        data = json.loads(Path(path).read_text())
        decode = data["stats"]["decode"]
        stall = decode["stall_ms_per_token"] / 1e3 if decode["tokens"] else 0.0
        if cpu_clock:  # the compute thread's CPU seconds a token, plus the wait for reads
            runs.setdefault(data["model"], []).extend(1 / (c + stall) for c in data["decode_cpu_s"])
        else:
            runs.setdefault(data["model"], []).extend(data["decode_tok_s"]["runs"])
        if decode["tokens"]:
            split.setdefault(data["model"], []).append((decode["seconds"] / decode["tokens"] - stall, stall))
    out = []
    for model, tok_s in runs.items():
        header = read_header(model)
        parts = split.get(model, [(0.0, 0.0)])
        out.append((block_reads(header), {"model": model, "blocks": header.n_layer - dense_lead(header),
                                          "median": statistics.median(tok_s), "min": min(tok_s), "max": max(tok_s),
                                          "runs": len(tok_s), "busy_s": statistics.median(p[0] for p in parts),
                                          "stall_s": statistics.median(p[1] for p in parts)}))
    return sorted(out, key=lambda r: r[0])


def predict(args) -> dict:
    runs = pooled(args.runs, args.clock == "cpu")
    full = read_header(args.full)
    x_full = block_reads(full)
    fixed, per_byte = fit([(x, 1 / tok["median"]) for x, tok in runs])
    out = {"subsets": [{"blocks": tok["blocks"], "block_read_bytes": x, "decode_tok_s": tok["median"],
                        "min": tok["min"], "max": tok["max"], "runs": tok["runs"], "busy_s": tok["busy_s"],
                        "stall_s": tok["stall_s"], "model": tok["model"]}
                       for x, tok in runs],
           "fixed_s": fixed, "s_per_block_gb": per_byte * 1e9, "full_blocks": full.n_layer - dense_lead(full),
           "full_block_read_bytes": x_full, "predicted_tok_s": 1 / (fixed + per_byte * x_full)}
    # the stall (compute waiting for disk reads) apart: its share need not scale with depth where a RAM cache of disk
    # experts grows into the RAM budget's slack, the same bytes whatever the subset (docs/large-moe.md)
    f, c = fit([(x, tok["busy_s"]) for x, tok in runs])
    out["busy_fixed_s"], out["busy_s_per_block_gb"], out["predicted_busy_s"] = f, c * 1e9, f + c * x_full
    # the spread: the same fit through every subset's slowest and fastest run
    for key, pick in (("predicted_min_tok_s", "min"), ("predicted_max_tok_s", "max")):
        f, c = fit([(x, 1 / tok[pick]) for x, tok in runs])
        out[key] = 1 / (f + c * x_full)
    if args.measured:
        (_, measured), = pooled(args.measured, args.clock == "cpu")
        out["measured"] = measured
        out["error"] = out["predicted_tok_s"] / measured["median"] - 1
    return out


def measure(args) -> dict:
    import random

    import hypura

    llm = hypura.Llama(args.model, n_ctx=args.ctx_size, n_threads=args.threads, verbose=False,
                       **({"gpu_mem": args.gpu_mem} if args.gpu_mem else {}), **({"ram": args.ram} if args.ram else {}))
    try:
        rng = random.Random(0)
        prompt = [rng.randrange(100, 1000) for _ in range(8)]  # as hypura bench's: random ids, no tokenizer needed
        llm.eval(prompt)  # warm-up: pages in, paths chosen
        llm.stats(reset=True)
        medians, cpu_medians, token_s = [], [], []
        for _ in range(args.repetitions):
            llm.reset()
            llm.eval(prompt)
            times, cpu = [], []
            for _ in range(args.n_gen):
                t0, c0 = time.perf_counter(), time.thread_time()
                llm.eval([rng.randrange(100, 1000)])
                times.append(time.perf_counter() - t0)
                cpu.append(time.thread_time() - c0)
            medians.append(1 / statistics.median(times))
            cpu_medians.append(statistics.median(cpu))
            token_s += times
        stats = llm.stats()
    finally:
        llm.close()
    # stats' decode phase holds the prompts' tokens too (8-token batches are prefill): its stall is the decode's
    return {"model": args.model, "decode_tok_s": {"median": statistics.median(medians), "min": min(medians),
                                                  "max": max(medians), "runs": medians},
            # -t 1: llama.cpp computes on this thread, so its CPU time is the token's work without the spells it
            # waited for a core (reads a pager waits for are not in it: the decode's stall, below, is)
            "decode_cpu_s": cpu_medians,
            "token_s": token_s, "stats": {"decode": stats["decode"], **{k: stats[k] for k in ("expert_paging",)
                                                                        if k in stats}}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python3 -m bench.extrapolate", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("budgets", help="a subset's budgets that keep the full model's tier shares")
    b.add_argument("full")
    b.add_argument("subset")
    b.add_argument("--profile", help="the target machine's profile (file or bundled example; default: this machine's)")
    b.add_argument("--gpu-mem")
    b.add_argument("--ram", required=True)
    b.add_argument("-c", "--ctx-size", type=int, default=4096)
    m = sub.add_parser("measure", help="decode tok/s of a model from the median token of each repeat")
    m.add_argument("model")
    m.add_argument("--gpu-mem")
    m.add_argument("--ram")
    m.add_argument("-c", "--ctx-size", type=int, default=512)
    m.add_argument("-n", "--n-gen", type=int, default=48)
    m.add_argument("-r", "--repetitions", type=int, default=3)
    m.add_argument("-t", "--threads", type=int, default=1)
    p = sub.add_parser("predict", help="full-depth decode from subset runs")
    p.add_argument("runs", nargs="+", help="hypura bench --json of two or more subsets")
    p.add_argument("--full", required=True, help="the full model (a --sparse header is enough)")
    p.add_argument("--measured", nargs="+", help="hypura bench --json runs of the full model, where it runs: the error")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: measure's runs by the compute thread's CPU seconds a token plus the stall (a shared "
                        "machine's busy spells left out)")
    for q in (b, m, p):
        q.add_argument("--json", help="write the result here")
    args = ap.parse_args(argv)
    out = {"budgets": budgets, "measure": measure, "predict": predict}[args.cmd](args)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "token_s"}, indent=1))  # every token's: in the file


if __name__ == "__main__":
    sys.exit(main())
