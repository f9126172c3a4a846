"""GET /metrics: Prometheus text exposition (format 0.0.4) of the server and of each model's engine.

The engine's `metrics()` (requests, tokens, tok/s, queue length, active sequences, and the Llama's
stats: bytes per tier, stall, expert hit rates) is a nested dict; every number in it becomes one
sample, named by its path (`hypura_engine_<key>_<key>...`) and labelled with the model, so a new
engine counter shows up here without a change. The server adds its HTTP request counts and each
request's figures (`hypura_request_...`: queue wait, time to first token, prompt and decode rates as
summaries, reused tokens: request_log.py), and each waiting request's place in its model's queue, labelled
with the request's id (`hypura_engine_queue_position`).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Iterable, Iterator

_NOT_METRIC = re.compile(r"[^a-zA-Z0-9_]+")


class HttpCounts:
    """Requests answered, by route and status (routes of this server only: the labels stay few)."""

    def __init__(self, routes: Iterable[str]):
        self.routes = frozenset(routes)
        self.counts: Counter = Counter()

    def count(self, path: str, status: int) -> None:
        self.counts[(path if path in self.routes else "other", status)] += 1


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def flatten(tree: dict, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, float]]:
    """(metric name, value) for every number in a nested dict; strings, lists and None are left out."""
    for key, value in tree.items():
        path = prefix + (str(key),)
        if isinstance(value, dict):
            yield from flatten(value, path)
        elif isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value)):
            yield _NOT_METRIC.sub("_", "_".join(path)).strip("_").lower(), float(value)


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


def render(engine_metrics: dict[str, dict], http: HttpCounts, ready: bool, requests=None) -> str:
    """`engine_metrics`: model name -> engine.metrics(); `requests`: request_log.RequestMetrics."""
    lines = ["# HELP hypura_ready 1 once every model is loaded", "# TYPE hypura_ready gauge",
             f"hypura_ready {int(ready)}",
             "# HELP hypura_http_requests_total HTTP requests answered, by route and status",
             "# TYPE hypura_http_requests_total counter"]
    for (route, status), n in sorted(http.counts.items()):
        lines.append(f'hypura_http_requests_total{{route="{_label(route)}",status="{status}"}} {n}')
    if requests is not None:
        lines += requests.render(_label)
    samples: dict[str, list[str]] = {}
    for model, tree in engine_metrics.items():
        seen = set()
        for name, value in flatten(tree):
            if name in seen:  # two paths spell one name ("decode_tok_s" and decode.tok_s): one series only
                continue
            seen.add(name)
            samples.setdefault(f"hypura_engine_{name}", []).append(f'{{model="{_label(model)}"}} {_number(value)}')
    for name, values in sorted(samples.items()):
        kind = "counter" if name.endswith("_total") else "gauge"
        lines += [f"# HELP {name} engine.metrics() of each model", f"# TYPE {name} {kind}"]
        lines += [name + v for v in values]
    return "\n".join(lines + list(_queue(engine_metrics))) + "\n"


def _queue(engine_metrics: dict[str, dict]) -> Iterator[str]:
    """Each waiting request's place in its model's queue (0: next) and how long it has waited."""
    waiting = [(model, r) for model, tree in engine_metrics.items() for r in tree.get("queue") or ()]
    if not waiting:
        return
    for name, key, what in (("hypura_engine_queue_position", "position", "place in the queue, 0: next"),
                            ("hypura_engine_queue_waited_seconds", "waited_s", "seconds waited so far")):
        yield from (f"# HELP {name} a waiting request's {what}", f"# TYPE {name} gauge")
        yield from (f'{name}{{model="{_label(model)}",request="{r["id"]}"}} {_number(float(r[key]))}'
                    for model, r in waiting)
