"""One decode token's graph splits from a `hypura bench --json` file: how long each run of nodes on one
backend took (from its start to the next one's), the sum per backend, and the longest ones, which is
where the "Second H200 session" waits of bench/RESULTS.md were found.

    python bench/split_profile.py bench/results/h200-2026-12-02-session8/call1-hypura-l70-g8-r64-planner.json
"""

import json
import sys
from collections import defaultdict


def splits(result: dict) -> list[tuple[str, str, float]]:
    """(first node, backend, ms) of each split of the last decode call."""
    st = result["stats"]["decode"]
    marks = st["last_call_splits_ms"] + [[st["last_call_timeline_ms"][-1][2], "end", ""]]
    return [(node, backend, nxt[0] - t) for (t, backend, node), nxt in zip(marks, marks[1:])]


def main(path: str, top: int = 8) -> None:
    runs = splits(json.load(open(path)))
    per_backend = defaultdict(float)
    for _, backend, ms in runs:
        per_backend[backend] += ms
    print(f"{len(runs)} splits, {sum(per_backend.values()):.1f} ms: " +
          ", ".join(f"{b} {ms:.1f} ms" for b, ms in per_backend.items()))
    for node, backend, ms in sorted(runs, key=lambda r: -r[2])[:top]:
        print(f"  {ms:7.2f} ms  {backend:10s} from {node}")


if __name__ == "__main__":
    main(*sys.argv[1:2])
