"""Speculative decoding: tok/s, tokens a pass and tokens accepted a pass, Hypura beside vanilla llama.cpp's
`llama-speculative-simple` with the same pair (or the same n-gram drafting), the same prompts and lengths.

    python3 bench/spec.py TARGET.gguf [--draft DRAFT.gguf ...] [--tree 0,4] [--tokens 64] [--n-max 16]
        [--prompt TEXT | --copy-prompts] [--threads N] [--gpu-mem 8GiB --ram 64GiB]
        [--vanilla-spec-args '-ngl 14 -ngld 99' ...] [--vanilla-bench-args '-ngl 14'] [--no-hypura] [--json FILE]
    python3 bench/spec.py TARGET.gguf --spec-type ngram-simple --copy-prompts [...]   # n-gram drafting, no draft model

Hypura's side loads the target once (hypura.loaded.load: a plan when --gpu-mem/--ram are given; the draft's
memory kept within the budgets, --gpu-mem grown by the draft's bytes so that the target keeps what vanilla's
-ngl gives it) and generates greedily: plain once a prompt (one llama_decode a token), then speculative with
each draft (several --draft: drafts of the same size, e.g. one per agreement) and each --tree value (0: a chain,
N: trees of up to N branches), the draft length or node budget chosen from the passes' measured cost.
Without --draft it drafts by --spec-type from the history (ngram-simple, prompt-lookup). Greedy outputs are
compared with plain decoding's; the script says where they differ.

Vanilla's side (DIR: --vanilla-dir, default beside our libllama): `llama-speculative-simple` with
`--spec-type draft-simple -md DRAFT` (this llama.cpp fails with "failed to initialize speculative decoding"
without the type) or `--spec-type ngram-simple` with the same lookup and draft lengths, once per
--vanilla-spec-args (e.g. mmap, and `-lm none`), and llama-bench's plain decode. Both sides report the same
figures: tok/s, tokens a pass (emitted: accepted drafts plus the pass's own) and drafted tokens accepted a pass
(vanilla's from its counters: each pass emits its accepted tokens plus one, so passes = n_predict - n_accept).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import hypura  # noqa: F401  first: our library loads before numpy
from hypura.speed.speculative import spec_report

TEXT = ("Hypura runs models larger than GPU memory: the planner decides where every tensor lives, GPU "
        "memory, pinned RAM or disk, and the weights that do not fit are streamed for every token.")
CODE = ("def mean(xs):\n    return sum(xs) / len(xs)\n\n\ndef variance(xs):\n    m = mean(xs)\n"
        "    return sum((x - m) ** 2 for x in xs) / len(xs)\n\n\ndef stdev(xs):\n    return variance(xs) ** 0.5\n")
COPY_PROMPTS = {
    "edit": f"Rewrite the text below, replacing 'GPU' with 'accelerator'. Change nothing else.\n\n{TEXT}\n\nRewritten:\n",
    "summarise": f"{TEXT}\n\nQuote the first sentence above word for word, then summarise it.\n\nQuote: ",
    "code": f"{CODE}\n\n# The same functions again, unchanged:\n\n{CODE[:30]}",
}
DEFAULT_PROMPT = "The history of the printing press begins"


def _load(path, args, **kw):
    from hypura.loaded import Ask, load
    from hypura.speculative.tree import context_params

    budgets = {k: v for k, v in (("gpu_mem", args.gpu_mem), ("ram", args.ram)) if v}
    if args.draft:
        # the draft's memory is kept within the budgets (plan/beside.py); --gpu-mem is the target's own, as
        # vanilla's -ngl is, so the GPU budget grows by the draft's bytes (the planner may still keep it in RAM)
        from hypura.modelfile import read_header
        from hypura.plan import parse_size
        from hypura.plan.beside import Beside

        kw["draft_beside"] = args.draft[0]
        if args.gpu_mem:
            budgets["gpu_mem"] = parse_size(args.gpu_mem) + Beside.of(read_header(args.draft[0])).nbytes(args.ctx)
    if max(args.tree):  # a tree's branches are sequences of one KV cache (chains run in it too)
        kw.setdefault("param_overrides", {"context_params": context_params(max(args.tree))})
    return load(str(path), Ask.of(n_ctx=args.ctx, n_threads=args.threads, n_threads_batch=args.threads,
                                      verbose=False, **budgets, **kw))


def _drafters(args) -> list[tuple[str, object, int]]:
    """(label, draft path or None, tree) of every speculative run."""
    if args.draft:
        return [(f"{d.stem}{f' tree {t}' if t else ''}", d, t) for d in args.draft for t in args.tree]
    return [(args.spec_type, None, 0)]


def hypura_runs(args, prompt: str) -> dict:
    """A plain greedy run of the prompt, then one speculative run per drafter (hypura/speed/speculative.py)."""
    from hypura.speed.speculative import SpecBenchSettings, compare_greedy, run_spec_bench
    from hypura.speculative.generate import Run
    from hypura.speculative import SpecSettings

    out, plain = {}, None
    target = _load(args.target, args)
    try:
        for label, draft, tree in _drafters(args):
            spec = SpecSettings(type="draft-simple" if draft else args.spec_type, draft_model=draft,
                                n_max=args.n_max, n_min=args.n_max if args.fixed else 0, ngram_size_n=args.ngram_n,
                                ngram_size_m=args.n_max, tree=tree)
            r = run_spec_bench(target, target.plan, spec, SpecBenchSettings(
                args.tokens, 1, prompt, plain=plain is None and not args.no_plain))
            if r["tokens"]["plain"] is not None:
                plain = r
            elif plain is not None:  # the first run's plain decode stands for all
                r["plain_tok_s"], r["speedup"] = plain["plain_tok_s"], \
                    r["spec_tok_s"]["median"] / plain["plain_tok_s"]["median"]
                base = Run(plain["tokens"]["plain"], 0.0, 0.0, tuple(plain["plain_gaps"]))
                r["greedy_identical"] = compare_greedy(base, Run(r["tokens"]["spec"], 0.0, 0.0))[0]
            out[label] = r
    finally:
        target.close()
    return out


def _vanilla_spec_cmd(args, tool: Path, prompt: str, draft, extra: str) -> list[str]:
    how = (["--spec-type", "draft-simple", "-md", str(draft), "--spec-draft-n-max", str(args.n_max)] if draft else
           ["--spec-type", args.spec_type, "--spec-ngram-simple-size-n", str(args.ngram_n),
            "--spec-ngram-simple-size-m", str(args.n_max)])
    return [str(tool), "-m", str(args.target), *how, "-p", prompt, "-n", str(args.tokens), "--temp", "0",
            "-c", str(args.ctx), "-t", str(args.threads), *shlex.split(extra)]


def parse_vanilla_spec(stderr: str) -> dict:
    """llama-speculative-simple's counters: tok/s of its decode, and per pass (passes = n_predict - n_accept)."""
    speed = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", stderr)
    n = {k: int(v) for k, v in re.findall(r"\b(n_predict|n_drafted|n_accept)\s+=\s+(\d+)", stderr)}
    if not speed or len(n) < 3:
        return {"tok_s": None}
    passes = max(n["n_predict"] - n["n_accept"], 1)
    return {"tok_s": float(speed.group(3)), "tokens": n["n_predict"], "passes": passes,
            "tokens_per_pass": n["n_predict"] / passes, "accepted_per_pass": n["n_accept"] / passes,
            "drafted_per_pass": n["n_drafted"] / passes,
            "acceptance": n["n_accept"] / n["n_drafted"] if n["n_drafted"] else 0.0}


def vanilla_runs(args, prompt: str, with_bench: bool) -> dict:
    d = Path(args.vanilla_dir) if args.vanilla_dir else _lib_dir()
    out = {}
    tool = d / "llama-speculative-simple"
    if tool.is_file():
        drafts = args.draft or [None]
        for draft in drafts:
            for extra in args.vanilla_spec_args or [""]:
                cmd = _vanilla_spec_cmd(args, tool, prompt, draft, extra)
                label = f"{draft.stem if draft else args.spec_type}{' ' + extra if extra else ''}"
                out[f"vanilla {label}"] = _run(cmd, parse_vanilla_spec, args.vanilla_timeout)
    bench_tool = d / "llama-bench"
    if with_bench and bench_tool.is_file():
        cmd = [str(bench_tool), "-m", str(args.target), "-p", "0", "-n", str(args.tokens), "-r", "1",
               "-t", str(args.threads), "-o", "json", *shlex.split(args.vanilla_bench_args)]
        out[f"vanilla plain {args.vanilla_bench_args}".rstrip()] = _run(
            cmd, lambda text: {"tok_s": json.loads(text)[0]["avg_ts"]}, args.vanilla_timeout, stdout=True)
    return out


def _run(cmd: list[str], parse, timeout_s: float, stdout: bool = False) -> dict:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"cmd": shlex.join(cmd), "rc": "timeout", "tok_s": None}
    try:
        parsed = parse(p.stdout if stdout else p.stderr)
    except (ValueError, IndexError, KeyError):
        parsed = {"tok_s": None}
    if parsed.get("tok_s") is None:
        parsed["error"] = (p.stderr.strip().splitlines() or ["no output"])[-1][:200]
    return {"cmd": shlex.join(cmd), "rc": p.returncode, **parsed}


def _lib_dir() -> Path:
    from hypura.bindings.library import lib_dir

    return lib_dir()


def table(results: dict) -> list[str]:
    """One line a run, both sides alike: tok/s, tokens a pass, drafted tokens accepted a pass, acceptance."""
    lines = [f"{'prompt':10s} {'run':44s} {'tok/s':>7s} {'tokens/pass':>11s} {'accepted/pass':>13s} "
             f"{'drafted/pass':>12s} {'acceptance':>10s}"]
    for prompt, runs in results.items():
        for label, r in runs.items():
            if "spec_tok_s" in r:  # Hypura's
                row = {"tok_s": r["spec_tok_s"]["median"], **{k: r[k]["median"] for k in (
                    "tokens_per_pass", "accepted_per_pass", "drafted_per_pass", "acceptance")}}
                note = "" if r.get("greedy_identical") is not False else "  greedy output DIFFERS from plain"
                if r.get("plain_tok_s") and label == next(iter(runs)):
                    lines.append(f"{prompt:10s} {'hypura plain':44s} {r['plain_tok_s']['median']:7.2f}")
                label = f"hypura {label}"
            else:
                row, note = r, "" if r.get("tok_s") is not None else f"  failed: {r.get('error')}"
            f = lambda k, w: f"{row[k]:{w}.2f}" if row.get(k) is not None else " " * (w - 1) + "-"  # noqa: E731
            lines.append(f"{prompt:10s} {label[:44]:44s} {f('tok_s', 7)} {f('tokens_per_pass', 11)} "
                         f"{f('accepted_per_pass', 13)} {f('drafted_per_pass', 12)} {f('acceptance', 10)}{note}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", type=Path)
    ap.add_argument("--draft", type=Path, action="append", help="a draft GGUF (repeat: one run each, one target load)")
    ap.add_argument("--spec-type", default="ngram-simple", choices=("ngram-simple", "prompt-lookup"),
                    help="without --draft: drafting from the history (vanilla runs ngram-simple)")
    ap.add_argument("--ngram-n", type=int, default=3, help="ngram-simple's lookup length (llama.cpp's default: 12)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--n-max", type=int, default=16, help="the longest draft (ngram-simple: its size m, both sides)")
    ap.add_argument("--fixed", action="store_true", help="always draft --n-max tokens (no cost model)")
    ap.add_argument("--tree", default="0", help="with --draft: comma-separated; 0 a chain, N trees of up to N branches")
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--copy-prompts", action="store_true", help="the copy-heavy prompts: edit, summarise, code")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--gpu-mem")
    ap.add_argument("--ram")
    ap.add_argument("--no-plain", action="store_true", help="no plain decode on Hypura's side")
    ap.add_argument("--no-hypura", action="store_true", help="vanilla's runs only")
    ap.add_argument("--no-vanilla", action="store_true", help="Hypura's runs only")
    ap.add_argument("--vanilla-dir")
    ap.add_argument("--vanilla-spec-args", action="append",
                    help="flags for llama-speculative-simple, e.g. '-ngl 14 -ngld 99' (repeat: a run each)")
    ap.add_argument("--vanilla-bench-args", default=None, help="llama-bench's plain decode with these flags "
                    "(e.g. '-ngl 14 -lm none'); '' for none; left out, no llama-bench run")
    ap.add_argument("--vanilla-timeout", type=float, default=300, help="seconds a vanilla run may take (then: failed)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    try:
        args.tree = [int(t) for t in args.tree.split(",")]
    except ValueError:
        ap.error(f"--tree takes comma-separated integers, not {args.tree!r}")
    if any(args.tree) and not args.draft:
        ap.error("--tree needs --draft")
    results = {}
    prompts = COPY_PROMPTS if args.copy_prompts else {"prompt": args.prompt}
    for i, (name, prompt) in enumerate(prompts.items()):
        runs = {} if args.no_hypura else hypura_runs(args, prompt)
        for label, r in runs.items():
            print("\n".join(f"{name:10s} {line}" for line in spec_report(r)), file=sys.stderr, flush=True)
        if not args.no_vanilla:
            runs |= vanilla_runs(args, prompt, with_bench=i == 0 and args.vanilla_bench_args is not None)
        results[name] = runs
    print("summary", file=sys.stderr)
    for line in table(results):
        print(line, file=sys.stderr)
    for runs in results.values():
        for r in runs.values():
            if "cmd" in r:
                print(f"  {r['cmd']}", file=sys.stderr)
            if isinstance(r.get("tokens"), dict):  # Hypura's token ids: compared above, not kept
                del r["tokens"]
    text = json.dumps(results, indent=1, default=str)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
