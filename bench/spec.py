"""Speculative decoding: tok/s, tokens per pass and pass cost by tokens carried, beside plain decoding
and beside vanilla llama.cpp's `llama-speculative-simple` with the same pair.

    python3 bench/spec.py TARGET.gguf [--draft DRAFT.gguf [--tree N] | --spec-type ngram-simple|prompt-lookup]
        [--tokens 128] [--n-max 16] [--prompt TEXT] [--threads N] [--gpu-mem 8GiB --ram 64GiB]
        [--vanilla-dir DIR] [--vanilla-spec-args '-ngl 14 -ngld 99'] [--vanilla-bench-args '-ngl 14'] [--json FILE]
    python3 bench/spec.py --copy-prompts MODEL.gguf [...]   # n-gram drafting on copy-heavy prompts

Hypura's runs load the target through hypura.Llama (a plan when --gpu-mem/--ram are given), the
draft beside it (resident: its memory kept within the budgets, --gpu-mem grown by the draft's bytes so the
target keeps what vanilla's -ngl gives it), and generate greedily: plain (one llama_decode a token) and speculative
(one verification pass a step, the draft length chosen from the passes' measured cost; --tree N: a
tree of up to N branches, its node budget chosen the same way). Greedy
outputs must match; the script says so. Where DIR (default: beside our libllama) holds
`llama-speculative-simple` (and `llama-bench`), the same pair runs there too: its decode t/s and
acceptance, and llama-bench's plain tg t/s. --copy-prompts runs three copy-heavy prompts (edit,
summarise, continue code) with --spec-type drafting and prints tokens per pass for each.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import hypura  # noqa: F401  first: our library loads before numpy
from hypura.bench.speculative import spec_report

TEXT = ("Hypura runs models larger than GPU memory: the planner decides where every tensor lives, GPU "
        "memory, pinned RAM or disk, and the weights that do not fit are streamed for every token.")
CODE = ("def mean(xs):\n    return sum(xs) / len(xs)\n\n\ndef variance(xs):\n    m = mean(xs)\n"
        "    return sum((x - m) ** 2 for x in xs) / len(xs)\n\n\ndef stdev(xs):\n    return variance(xs) ** 0.5\n")
COPY_PROMPTS = {
    "edit": f"Rewrite the text below, replacing 'GPU' with 'accelerator'. Change nothing else.\n\n{TEXT}\n\nRewritten:\n",
    "summarise": f"{TEXT}\n\nQuote the first sentence above word for word, then summarise it.\n\nQuote: ",
    "continue": f"{CODE}\n\n# The same functions again, unchanged:\n\n{CODE[:30]}",
}
DEFAULT_PROMPT = "The history of the printing press begins"


def _load(path, args, **kw):
    from hypura import Llama

    from hypura.speculative.tree import context_params

    budgets = {k: v for k, v in (("gpu_mem", args.gpu_mem), ("ram", args.ram)) if v}
    if args.draft and not kw.get("draft_model"):
        # the draft's memory is kept within the budgets (plan/beside.py); --gpu-mem is the target's own, as
        # vanilla's -ngl is, so the GPU budget grows by the draft's bytes (the planner may still keep it in RAM)
        from hypura.modelfile import read_header
        from hypura.plan import parse_size
        from hypura.plan.beside import Beside

        kw["draft_beside"] = args.draft
        if args.gpu_mem:
            budgets["gpu_mem"] = parse_size(args.gpu_mem) + Beside.of(read_header(args.draft)).nbytes(args.ctx)
    if args.tree:  # the tree's branches are sequences of one KV cache
        kw.setdefault("param_overrides", {"context_params": context_params(args.tree)})
    return Llama(str(path), n_ctx=args.ctx, n_threads=args.threads, n_threads_batch=args.threads,
                 verbose=False, **budgets, **kw)


def hypura_runs(args, prompt: str) -> dict:
    """One plain and one speculative greedy run of the prompt (hypura bench's, hypura/bench/speculative.py)."""
    from hypura.bench.speculative import SpecBenchSettings, run_spec_bench
    from hypura.speculative import SpecSettings

    spec = SpecSettings(type="draft-simple" if args.draft else args.spec_type, draft_model=args.draft,
                        n_max=args.n_max, n_min=args.n_max if args.fixed else 0, ngram_size_n=args.ngram_n,
                        ngram_size_m=args.n_max, tree=args.tree)
    target = _load(args.target, args)
    try:
        return run_spec_bench(target, target.plan, spec, SpecBenchSettings(args.tokens, 1, prompt,
                                                                           plain=not args.no_plain))
    finally:
        target.close()


def vanilla_runs(args, prompt: str) -> dict:
    d = Path(args.vanilla_dir) if args.vanilla_dir else _lib_dir()
    out = {}
    spec_tool = d / "llama-speculative-simple"
    if spec_tool.is_file() and args.draft:
        cmd = [str(spec_tool), "-m", str(args.target), "-md", str(args.draft), "-p", prompt, "-n", str(args.tokens),
               "--temp", "0", "--spec-draft-n-max", str(args.n_max), "-c", str(args.ctx), "-t", str(args.threads),
               *shlex.split(args.vanilla_spec_args)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", p.stderr)
        a = re.search(r"accept\s+=\s+([\d.]+)%", p.stderr)
        out["vanilla_spec"] = {"cmd": " ".join(cmd), "rc": p.returncode,
                               "tok_s": float(m.group(3)) if m else None, "acceptance": float(a.group(1)) / 100 if a else None}
    bench_tool = d / "llama-bench"
    if bench_tool.is_file():
        cmd = [str(bench_tool), "-m", str(args.target), "-p", "0", "-n", str(args.tokens), "-t", str(args.threads),
               "-o", "json", *shlex.split(args.vanilla_bench_args)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        try:
            out["vanilla_plain"] = {"cmd": " ".join(cmd), "tok_s": json.loads(p.stdout)[0]["avg_ts"]}
        except (ValueError, IndexError, KeyError):
            out["vanilla_plain"] = {"cmd": " ".join(cmd), "rc": p.returncode, "tok_s": None}
    return out


def _lib_dir() -> Path:
    from hypura.bindings.library import lib_dir

    return lib_dir()


def _row(name: str, r: dict) -> str:
    return "\n".join(f"{name:10s} {line}" for line in spec_report(r))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target", type=Path)
    ap.add_argument("--draft", type=Path)
    ap.add_argument("--spec-type", default="ngram-simple", choices=("ngram-simple", "prompt-lookup"))
    ap.add_argument("--ngram-n", type=int, default=3, help="ngram-simple's lookup length (llama.cpp's default: 12)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--n-max", type=int, default=16)
    ap.add_argument("--fixed", action="store_true", help="always draft --n-max tokens (no cost model)")
    ap.add_argument("--tree", type=int, default=0, help="--draft: verify trees of up to N branches, --n-max deep")
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--gpu-mem")
    ap.add_argument("--ram")
    ap.add_argument("--no-plain", action="store_true")
    ap.add_argument("--copy-prompts", action="store_true")
    ap.add_argument("--vanilla-dir")
    ap.add_argument("--vanilla-spec-args", default="", help="extra flags for llama-speculative-simple (e.g. '-ngl 14 -ngld 99')")
    ap.add_argument("--vanilla-bench-args", default="", help="extra flags for llama-bench (e.g. '-ngl 14 -lm none')")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.threads is None:
        import os

        args.threads = os.cpu_count() or 1
    results = {}
    prompts = COPY_PROMPTS if args.copy_prompts else {"prompt": args.prompt}
    for name, prompt in prompts.items():
        results[name] = hypura_runs(args, prompt)
        print(_row(name, results[name]), file=sys.stderr, flush=True)
    if not args.copy_prompts:
        results["vanilla"] = vanilla_runs(args, args.prompt)
        for key, r in results["vanilla"].items():
            print(f"{key:10s} {r.get('tok_s')} tok/s" + (f", acceptance {r['acceptance']}" if "acceptance" in r else "")
                  + f"  ({r['cmd']})", file=sys.stderr)
    text = json.dumps(results, indent=1, default=str)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
