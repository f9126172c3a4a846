"""A seeded GGUF mutation campaign: `python -m tests.fuzz.run --cases 10000 --seed 1`.

Case i mutates one of the seed models (SmolLM2-135M, `hypura synth tiny-llama`, `tiny-qwen3moe`)
with random.Random(f"{seed}:{i}"), so any case is reproduced with `--only i` (and kept with
`--keep DIR`); it then runs through both paths (runner.py) and the outcome table per path is
printed at the end. `--json FILE` writes every case's outcome, `--files` runs given files instead.
Mutated copies live in /dev/shm (tmpfs): a 100 MB seed costs a memory copy per case, not a disk write.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from . import runner
from .gguf_model import parse
from .mutators_meta import mutate

PATHS = ("cli", "llama")  # the default; `--paths cli,llama,budget` adds streaming and paging under budgets
SEED_WEIGHTS = {"smollm2": 2, "tiny-llama": 4, "tiny-qwen3moe": 4}  # tiny models load in a fraction of the time
TIMEOUT = 120.0  # seconds a case may run before it counts as a hang (SmolLM2 takes ~2 s)


def seed_files(workdir: Path) -> dict[str, Path]:
    """The seed models: SmolLM2 from its package, the tiny ones written by `hypura synth`."""
    from hypura.models import default_model_path
    from hypura.synth import write_synth

    seeds = {"smollm2": Path(default_model_path())}
    for shape in ("tiny-llama", "tiny-qwen3moe"):
        seeds[shape] = workdir / f"{shape}.gguf"
        if not seeds[shape].exists():
            write_synth(shape, seeds[shape])
    return seeds


def _scratch() -> Path:
    shm = Path("/dev/shm")
    return Path(tempfile.mkdtemp(prefix="hypura-fuzz-", dir=shm if shm.is_dir() else None))


def campaign(cases: range, seed: int, seeds: dict[str, Path], workdir: Path, timeout: float, keep=None,
             on_case=None, kinds=None, paths=PATHS) -> list[dict]:
    parsed = {name: (p.read_bytes(),) for name, p in seeds.items()}
    parsed = {name: (raw[0], parse(raw[0])) for name, raw in parsed.items()}
    names = [n for n in SEED_WEIGHTS if n in parsed]
    records = []
    for i in cases:
        rng = random.Random(f"{seed}:{i}")
        name = rng.choices(names, [SEED_WEIGHTS[n] for n in names])[0]
        raw, model = parsed[name]
        kind, desc, chunks = mutate(rng, model, raw, kinds)
        path = workdir / f"case-{i}.gguf"
        with open(path, "wb") as f:
            f.writelines(chunks)
        for which in paths:
            sys.stdout.flush()
            r = runner.run(str(path), which, str(workdir), timeout)
            rec = {"case": i, "seed_model": name, "kind": kind, "mutation": desc, "path": which,
                   "outcome": r.outcome, "detail": r.detail, "seconds": round(r.seconds, 2), "peak_rss": r.peak_rss}
            records.append(rec)
            if on_case:
                on_case(rec)
        if keep and any(rec["outcome"] not in ("clean", "ran") for rec in records[-len(paths):]):
            shutil.copy(path, Path(keep) / path.name)
        path.unlink()
    return records


def run_files(files: list[str], workdir: Path, timeout: float, on_case=None, paths=PATHS) -> list[dict]:
    records = []
    for f in files:
        for which in paths:
            sys.stdout.flush()
            r = runner.run(f, which, str(workdir), timeout)
            records.append({"file": f, "path": which, "outcome": r.outcome, "detail": r.detail,
                            "seconds": round(r.seconds, 2), "peak_rss": r.peak_rss})
            if on_case:
                on_case(records[-1])
    return records


def table(records: list[dict], paths=PATHS) -> str:
    rows = ["| path | cases | " + " | ".join(runner.OUTCOMES) + " |", "|---" * (len(runner.OUTCOMES) + 2) + "|"]
    for which in paths:
        counts = Counter(r["outcome"] for r in records if r["path"] == which)
        rows.append(f"| {which} | {sum(counts.values())} | " + " | ".join(str(counts[o]) for o in runner.OUTCOMES)
                    + " |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0, help="first case index")
    ap.add_argument("--only", type=int, help="run this case index alone")
    ap.add_argument("--files", nargs="*", help="run these model files instead of mutations")
    ap.add_argument("--keep", help="copy cases that did not end clean or ran here")
    ap.add_argument("--kinds", help="only these mutations (comma-separated names)")
    ap.add_argument("--paths", default=",".join(PATHS), help="cli, llama and/or budget (comma-separated)")
    ap.add_argument("--json", help="write every outcome here (JSON lines)")
    ap.add_argument("--timeout", type=float, default=TIMEOUT)
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    os.nice(10)  # cores are shared: the campaign yields to interactive work
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed campaign still removes its scratch files
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's pool would be a thread of the fork server
    paths = tuple(args.paths.split(","))
    runner.prepare(paths)
    workdir = _scratch()
    os.environ.setdefault("HYPURA_ROUTING_DIR", str(workdir / "routing"))
    t0 = time.monotonic()
    out = open(args.json, "w") if args.json else None

    def on_case(rec):
        if out:
            out.write(json.dumps(rec) + "\n")
            out.flush()
        if not args.quiet and rec["outcome"] not in ("clean", "ran"):
            what = f"case {rec['case']}" if "case" in rec else rec["file"]
            print(f"{what} {rec['path']}: {rec['outcome']}: {rec.get('mutation', '')} -> {rec['detail']}", flush=True)

    try:
        if args.files:
            records = run_files(args.files, workdir, args.timeout, on_case, paths)
        else:
            if args.keep:
                Path(args.keep).mkdir(parents=True, exist_ok=True)
            cases = range(args.only, args.only + 1) if args.only is not None else \
                range(args.start, args.start + args.cases)
            kinds = set(args.kinds.split(",")) if args.kinds else None
            records = campaign(cases, args.seed, seed_files(workdir), workdir, args.timeout, args.keep, on_case, kinds,
                               paths)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if out:
            out.close()
    print(table(records, paths))
    print(f"{len(records) // len(paths)} cases, seed {args.seed}, {time.monotonic() - t0:.0f} s")
    bad = sum(r["outcome"] not in ("clean", "ran") for r in records)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
