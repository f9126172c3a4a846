"""What `hypura bench` prints: one sequence's prefill and decode beside the bound (a sweep of -p or -n: llama-bench's
ppN and tgN rows, with seconds a pass or a token), or the batched engine's table (one row a size)."""

from __future__ import annotations

from hypura.runtime.stats import describe


def report(r: dict) -> list[str]:
    if "spec_tok_s" in r:
        from hypura.speed.speculative import spec_report

        return spec_report(r)
    return batched_report(r) if "sizes" in r else single_report(r)


def single_report(r: dict) -> list[str]:
    lines = []
    for row in r.get("prefill_sweep", []):  # llama-bench's ppN rows: what a pass of N tokens costs
        m, t = row["tok_s"], row["pass_s"]
        lines.append(f"pp{row['n_prompt']:<6d}{m['median']:9.2f} tok/s  {t['median']:9.4f} s a pass   (median of "
                     f"{len(m['runs'])}: min {m['min']:.2f}, max {m['max']:.2f} tok/s)")
    for row in r.get("decode_sweep", []):  # tgN rows: N tokens decoded one at a time from an empty context
        m = row["tok_s"]
        lines.append(f"tg{row['n_gen']:<6d}{m['median']:9.2f} tok/s  {1 / m['median']:9.4f} s a token  (median of "
                     f"{len(m['runs'])}: min {m['min']:.2f}, max {m['max']:.2f} tok/s)")
    for phase in ("prefill", "decode") if "decode_sweep" not in r else ():
        m = r[f"{phase}_tok_s"]
        if m:
            lines.append(f"{phase:8s} {m['median']:9.2f} tok/s  (median of {len(m['runs'])}: min {m['min']:.2f}, "
                         f"max {m['max']:.2f})")
    lines += describe(r["stats"])
    if (r.get("plan") or {}).get("routing_tokens"):
        lines.append(f"plan     expert frequencies from {r['plan']['routing_tokens']} tokens of recorded routing")
    if r.get("bound"):
        b = r["bound"]
        ratio = f"; measured/bound {r['bound_ratio']:.2f}" if "bound_ratio" in r else ""  # none without decode (-n 0)
        lines.append(f"bound    {b['decode_tok_s']:9.2f} tok/s  ({b['limit']}){ratio}")
    if r.get("bound_now"):
        p = r["disk_probe"]
        lines.append(f"bound    {r['bound_now']['decode_tok_s']:9.2f} tok/s  (disk as probed beside the runs: "
                     f"{p['before']['gbps']:.2f} GB/s before, {p['after']['gbps']:.2f} after, bursts of "
                     f"{p['after']['experts_per_burst']} expert(s)); measured/bound {r['bound_now_ratio']:.2f}")
    return lines


def batched_report(r: dict) -> list[str]:
    s = r["settings"]
    cell = lambda m, f: f"{m['median']:{f}} ({m['min']:{f}}-{m['max']:{f}})" if m else "-"  # noqa: E731
    lines = [f"npp {s['n_prompt']}, ntg {s['n_gen']}, threads {s['n_threads']}: median (min-max) of {s['repeats']} "
             "runs; llama_decode: decode tok/s counting only llama_decode and synchronize; bound: a step's weight "
             "bytes over the measured rates; predicted: the cost model's decode / prefill for the plan",
             f"{'B':>4} {'prefill tok/s':>24} {'aggregate decode tok/s':>26} {'llama_decode':>13} {'predicted':>17} "
             f"{'bound':>10}"]
    for row in r["sizes"]:
        ld, b = row["llama_decode_tok_s"], row["bound"]
        bound = f"{b['decode_tok_s']:.2f}" if b else "-"
        why = f"  {b['limit']}, measured/bound {row['bound_ratio']:.2f}" if "bound_ratio" in row else ""
        p = row.get("predicted")
        pred = f"{p['decode_tok_s']:.2f} / {p['prefill_tok_s']:.0f}" if p else "-"
        lines.append(f"{row['parallel']:>4} {cell(row['prefill_tok_s'], '.1f'):>24} "
                     f"{cell(row['decode_tok_s'], '.2f'):>26} {format(ld['median'], '.2f') if ld else '-':>13} "
                     f"{pred:>17} {bound:>10}{why}")
    return lines
