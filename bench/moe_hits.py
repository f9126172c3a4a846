"""Expert hit rates of a MoE run paging experts from disk, beside an LRU cache of the same size on the same routing.

    python3 -m bench.moe_hits MODEL.gguf --ram 2GiB [-n 256] [-t 1] [--runs 2] [--ram-experts fixed] [--json out.json]

Runs MODEL (a layer subset: `hypura synth qwen3-235b-a22b sub.gguf --layers 4`) greedy from a fixed prompt under a
RAM budget that leaves experts on disk, recording every MoE layer's selections (on_route). Then replays that
routing through LRU caches and Belady's optimum of the run's capacity in experts (per layer: the layer's RAM
experts plus its share of the pager's read experts; over all layers: their sum) and through the pager's model (the
plan's RAM experts fixed, one LRU of read experts; where the pager evicts RAM experts, one LRU of all), and
reports, over the decode tokens: our hit rate (selections not read from disk) beside those, the prefetch
counters, decode tok/s beside the disk bound (disk bytes a token over the rate `probe_disk` measures right after),
and how much of the next layer's selections co-activation counts name a layer ahead. Runs share one routing
directory: run 1 plans from no recorded routing (k/E), run 2 from run 1's. The routing itself goes to
PATH.routes.json beside --json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import OrderedDict, defaultdict
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

PROMPT_SEED = 0
PROMPT_TOKENS = 32  # fixed token ids: a synthetic model has no meaningful text
PROBE_S = 3.0


def lru_hits(accesses: Iterable[tuple[object, object]], capacity: dict, warm: int = 0,
             size=lambda key: 1) -> tuple[int, int]:
    """(hits, accesses) of LRU caches, one per group, of capacity[group] (in size(key) units: keys by default)
    each, over (group, key) accesses in order; the first `warm` accesses fill the caches and are not counted."""
    caches: dict = defaultdict(OrderedDict)
    held: dict = defaultdict(int)
    hits = counted = 0
    for i, (group, key) in enumerate(accesses):
        cache = caches[group]
        hit = key in cache
        if hit:
            cache.move_to_end(key)
        else:
            cache[key] = size(key)
            held[group] += cache[key]
            while held[group] > capacity[group]:
                held[group] -= cache.popitem(last=False)[1]
        if i >= warm:
            counted += 1
            hits += hit
    return hits, counted


def fixed_then_lru_hits(accesses: Sequence[tuple[object, object]], fixed: dict, capacity: int,
                        warm: int = 0) -> tuple[int, int]:
    """As lru_hits, for the pager's model: keys of fixed[group] always hit (the plan's RAM experts); the rest go
    through one LRU cache of `capacity` (group, key) pairs (its read experts, shared by the layers)."""
    rest = [(i, (0, a)) for i, a in enumerate(accesses) if a[1] not in fixed.get(a[0], ())]
    hits, _ = lru_hits([a for _, a in rest], {0: capacity}, sum(i < warm for i, _ in rest))
    fixed_hits = sum(key in fixed.get(group, ()) for group, key in accesses[warm:])
    return hits + fixed_hits, len(accesses) - warm


def opt_hits(accesses: Sequence[tuple[object, object]], capacity: dict, warm: int = 0) -> tuple[int, int]:
    """As lru_hits, for Belady's optimal cache (evicts the key used again last): no cache of that size does better."""
    next_use, seen = [0] * len(accesses), {}
    for i in range(len(accesses) - 1, -1, -1):
        next_use[i] = seen.get(accesses[i], len(accesses))
        seen[accesses[i]] = i
    caches: dict = defaultdict(dict)  # group -> key -> its next use
    hits = counted = 0
    for i, (group, key) in enumerate(accesses):
        cache = caches[group]
        hit = key in cache
        cache[key] = next_use[i]
        if len(cache) > capacity[group]:
            del cache[max(cache, key=cache.get)]
        if i >= warm:
            counted += 1
            hits += hit
    return hits, counted


def layer_ahead(tokens: Sequence[Sequence[Sequence[int]]], m: int, warm: int = 0) -> dict:
    """Co-activation prediction replayed on recorded routing: tokens[t][i] = token t's experts at MoE layer i. At
    layer i the m experts most often seen at layer i+1 after those selected (counted from earlier tokens only) are
    predicted; recall: share of layer i+1's selections predicted; precision: share of predictions selected. Tokens
    before `warm` only count."""
    counts: dict[int, np.ndarray] = {}
    hit = chosen = named = 0
    for t, layers in enumerate(tokens):
        for i in range(len(layers) - 1):
            a, b = np.asarray(layers[i]), np.asarray(layers[i + 1])
            c = counts.setdefault(i, np.zeros((0, 0), np.int64))
            n = max(int(a.max()), int(b.max()), len(c) - 1) + 1
            if n > len(c):
                c = counts[i] = np.pad(c, ((0, n - len(c)), (0, n - len(c))))
            if t >= warm:
                scores = c[a].sum(axis=0)
                predicted = [int(e) for e in np.argsort(-scores, kind="stable")[:m] if scores[e] > 0]
                hit += len(set(predicted) & set(b.tolist()))
                chosen += len(b)
                named += len(predicted)
            np.add.at(c, (a[:, None], b[None, :]), 1)
    return {"m": m, "recall": hit / chosen if chosen else 0.0, "precision": hit / named if named else 0.0}


def _drop_file_cache(path: str) -> None:
    """The model's pages leave the page cache (no root needed): the load reads from disk, as a cold start."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def run_once(args) -> dict:
    import llama_cpp

    import hypura

    routes: list[tuple[int, int, np.ndarray]] = []  # (step, layer, ids [n_tokens, k])
    step = [0]

    def on_route(layer: int, ids: np.ndarray) -> None:
        if len(ids):  # a prompt's micro-batch that outputs no row routes no token at the last layer
            routes.append((step[0], layer, np.array(ids, copy=True)))

    if args.ram_experts == "fixed":  # as before the pager took a tie plan's RAM experts into its LRU
        import hypura.runtime.runtime

        hypura.runtime.runtime.ram_experts_evictable = lambda plan: False
    _drop_file_cache(args.model)
    t0 = time.perf_counter()
    llm = hypura.Llama(args.model, n_ctx=args.ctx_size, n_threads=args.threads, verbose=False, ram=args.ram,
                       on_route=on_route)
    load_s = time.perf_counter() - t0
    try:
        pager = llm._pager
        if pager is None:
            raise SystemExit("moe_hits: the plan keeps no expert on disk at this --ram")
        pager_layers = sorted(pager.tier_of)
        rng = np.random.default_rng(PROMPT_SEED)
        prompt = [int(x) for x in rng.integers(100, 1000, PROMPT_TOKENS)]
        llm.eval(prompt)
        llm.stats(reset=True)
        n_vocab, out, times = llm.n_vocab(), [], []
        for i in range(args.n_gen):
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(llm.ctx), shape=(n_vocab,))  # the last token's
            tok = int(np.argmax(logits))
            out.append(tok)
            step[0] = i + 1
            t1 = time.perf_counter()
            llm.eval([tok])
            times.append(time.perf_counter() - t1)
        stats = llm.stats()
        pg = pager.summary()
        expert_bytes = {layer: pager._expert_bytes(layer) for layer in pager_layers}
        ram_experts = {layer: [e for e, t in enumerate(pager.tier_of[layer]) if t != "disk"] for layer in pager_layers}
        probe = llm.probe_disk(PROBE_S)
    finally:
        llm.close()
    return _report(args, routes, pager_layers, out, times, stats, pg, expert_bytes, ram_experts, probe, load_s)


def replays(routes, capacity: dict, fixed: dict | None = None, staged: int = 0, expert_bytes: dict | None = None,
            budget: int = 0) -> dict:
    """Hit rates over the decode's selections (the prompt's, step 0, fill the caches) of LRU and of the optimum,
    per layer at capacity[layer] experts, and over all layers at their sum (one cache, as the pager's read experts);
    with `fixed` (layer -> the plan's RAM experts), the pager's model at `staged` read experts; with expert_bytes
    (layer -> one expert's bytes), an LRU over all layers of `budget` bytes (layers' experts differ in size)."""
    accesses, warm = [], 0
    for s, layer, ids in routes:
        for row in ids:
            warm += len(row) if s == 0 else 0
            accesses += [(layer, int(e)) for e in row]
    pooled, total = [(0, a) for a in accesses], {0: sum(capacity.values())}
    rates = {"lru_per_layer": lru_hits(accesses, capacity, warm), "lru_global": lru_hits(pooled, total, warm),
             "optimal_per_layer": opt_hits(accesses, capacity, warm), "optimal_global": opt_hits(pooled, total, warm)}
    if fixed is not None:
        rates["modelled_ours"] = fixed_then_lru_hits(accesses, fixed, staged, warm)
    if expert_bytes:
        rates["lru_global_bytes"] = lru_hits(pooled, {0: budget}, warm, size=lambda key: expert_bytes[key[0]])
    counted = len(accesses) - warm
    return {**{k: hits / counted if counted else 0.0 for k, (hits, _) in rates.items()}, "selections": counted}


def _report(args, routes, layers, out, times, stats, pg, expert_bytes, ram_experts, probe, load_s) -> dict:
    n = len(times)
    # the pager's share for read experts (less the RAM experts it holds in the same LRU), in experts of the average
    # layer, split evenly over the layers
    mean_bytes = sum(expert_bytes.values()) / len(expert_bytes)
    in_lru = pg["ram_in_lru_bytes"]
    held = min(pg["budget"], max(pg["resident_peak"], pg["resident"]))
    staged = int((held - in_lru) // mean_bytes)
    capacity = {layer: len(ram_experts[layer]) + staged // len(layers) for layer in layers}
    fixed = {} if in_lru else {layer: set(ids) for layer, ids in ram_experts.items()}
    ram_bytes = sum(len(ids) * expert_bytes[layer] for layer, ids in ram_experts.items())
    rates = replays(routes, capacity, fixed, staged + (sum(map(len, ram_experts.values())) if in_lru else 0),
                    expert_bytes, held - in_lru + ram_bytes)  # the same bytes as ours: RAM experts and read ones
    served = pg["served"]
    total = sum(served.values())
    ours = 1 - served.get("disk", 0) / total if total else 0.0
    per_token = defaultdict(dict)  # step -> layer -> experts (decode tokens and the prompt's last)
    for s, layer, ids in routes:
        per_token[s][layer] = ids[-1].tolist()
    tokens = [[per_token[s][layer] for layer in layers] for s in sorted(per_token) if len(per_token[s]) == len(layers)]
    k = len(routes[0][2][0])
    disk_bytes_token = pg["bytes"] / n
    decode_s = sum(times)
    return {
        "model": args.model, "ram": args.ram, "threads": args.threads, "n_gen": n, "load_s": load_s,
        "moe_layers": layers, "k": k, "distinct_tokens": len(set(out)),
        "capacity_experts": {"per_layer": capacity, "ram_experts": {layer: len(ids) for layer, ids in ram_experts.items()},
                             "ram_expert_ids": ram_experts, "staged": staged,
                             "ram_experts_in_lru": bool(pg["ram_in_lru_bytes"]),
                             "expert_bytes": expert_bytes},
        "hit_rate": {"ours": ours, **rates, "ours_selections": total},
        "prefetch": pg["prefetch"],
        "layer_ahead": layer_ahead(tokens, k, warm=1),
        "decode": {"tok_s": n / decode_s, "median_token_s": float(np.median(times)),
                   "stall_ms_per_token": stats["decode"]["stall_ms_per_token"],
                   "disk_mb_per_token": disk_bytes_token / 1e6,
                   "disk_gbps_probe": probe["gbps"] if probe else None,
                   "disk_bound_tok_s": probe["gbps"] * 1e9 / disk_bytes_token if probe and disk_bytes_token else None},
        "paging": pg, "probe": probe, "predicted": stats.get("predicted"),
        # the recorded routing, for other replays: (step, layer, each token's experts); step 0 is the prompt (write())
        "routes": [[s, layer, ids.tolist()] for s, layer, ids in routes],
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python3 -m bench.moe_hits", description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--ram", required=True, help="RAM budget that leaves experts on disk")
    ap.add_argument("-c", "--ctx-size", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=256)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=2, help="runs sharing one routing directory (the first plans from none)")
    ap.add_argument("--json", help="write the result here")
    ap.add_argument("--ram-experts", choices=("plan", "fixed"), default="plan",
                    help="fixed: a paged stack's RAM experts stay fixed even where the runtime would evict them "
                         "(the comparison)")
    args = ap.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory(prefix="moe-hits-routing-") as routing:
        os.environ["HYPURA_ROUTING_DIR"] = routing  # a clean record: run 1 plans at k/E
        for _ in range(args.runs):
            runs.append(run_once(args))
            print(json.dumps({k: runs[-1][k] for k in ("hit_rate", "capacity_experts", "prefetch", "layer_ahead",
                                                         "decode")}, indent=1))
    result = {"command": "python3 -m bench.moe_hits " + " ".join(argv if argv is not None else sys.argv[1:]),
              "runs": runs}
    if args.json:
        write(Path(args.json), result)


def write(path: Path, result: dict) -> None:
    """The result at `path`, each run's recorded routing beside it in one compact line (PATH.routes.json)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    routes = [run.pop("routes") for run in result["runs"]]
    path.write_text(json.dumps(result, indent=1) + "\n")
    path.with_suffix(".routes.json").write_text(json.dumps({"runs": routes}, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    sys.exit(main())
