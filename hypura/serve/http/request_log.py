"""One log line per request, and the per-request figures of /metrics.

Protocol: the Guard opens a record for each HTTP request (`opened()`, a contextvar: the tasks a route
starts inherit it) and, once the answer has ended, writes the request's one line (`line()`) and adds its
engine requests to `RequestMetrics`. Each engine request submitted for it (generation.submit) joins the
record with its model's name (`add()`); its Result is read at the end, so a stream's line is written when
the stream ends. Everything runs on the server's event loop: no lock.

A line: `127.0.0.1:5000 POST /v1/chat/completions 200 0.84 s | smollm2-135m-instruct:q4_1 stop: prompt 64
tokens (49 cached, 15 at 310 tok/s), 20 generated at 61.2 tok/s, queued 0.000 s, first token 0.051 s`.
"""

from __future__ import annotations

import collections
import contextvars
import math
from typing import Iterator, Optional

from hypura.engine import Result

WINDOW = 256  # requests per model the quantiles of /metrics are taken over: the recent ones
QUANTILES = (0.5, 0.9, 0.99)

_RECORD: contextvars.ContextVar[Optional[list]] = contextvars.ContextVar("hypura_request_record", default=None)


def opened() -> list:
    """A new record for the request being served (in the current context)."""
    record: list = []
    _RECORD.set(record)
    return record


def add(model: str, stream) -> None:
    """An engine request (bridge.EngineStream) submitted for the current HTTP request."""
    record = _RECORD.get()
    if record is not None:
        record.append((model, stream))


def results(record: list) -> list[tuple[str, Optional[Result]]]:
    """(model, Result) of the record's engine requests; None for one the engine has not ended yet (a
    cancelled stream's request ends at the engine's next step)."""
    return [(model, stream.request.result(timeout=0) if stream.request.done else None) for model, stream in record]


def line(client: str, method: str, path: str, status: int, seconds: float,
         ended: list[tuple[str, Optional[Result]]]) -> str:
    head = f"{client}{method} {path} {status} {seconds:.2f} s"
    return " | ".join([head, *(f"{model} {_costs(r) if r else 'cancelled'}" for model, r in ended)])


def _costs(r: Result) -> str:
    evaluated = r.prompt_tokens - r.cached_tokens
    prompt = f"{evaluated} at {r.prompt_tok_s:.0f} tok/s" if r.prompt_tok_s else f"{evaluated} evaluated"
    generated = f"{r.completion_tokens} generated" + (f" at {r.decode_tok_s:.1f} tok/s" if r.decode_tok_s else "")
    first = f", first token {r.ttft_s:.3f} s" if r.ttft_s is not None else ""
    return (f"{r.finish_reason}: prompt {r.prompt_tokens} tokens ({r.cached_tokens} cached, {prompt}), {generated}, "
            f"queued {r.queued_s:.3f} s{first}")


# name, help, what a Result gives (None: the request has no such figure)
SUMMARIES = (
    ("hypura_request_queue_seconds", "seconds a request waited for a sequence", lambda r: r.queued_s),
    ("hypura_request_time_to_first_token_seconds", "seconds from submission to the first token (queue and prompt)",
     lambda r: r.ttft_s),
    ("hypura_request_prompt_tok_s", "prompt tokens evaluated a second (the reused ones not counted)",
     lambda r: r.prompt_tok_s),
    ("hypura_request_decode_tok_s", "tokens generated a second after the first", lambda r: r.decode_tok_s),
)
COUNTERS = (
    ("hypura_request_prompt_tokens_total", "prompt tokens of the requests", lambda r: r.prompt_tokens),
    ("hypura_request_cached_tokens_total", "prompt tokens reused from the KV cache instead of evaluated",
     lambda r: r.cached_tokens),
    ("hypura_request_generated_tokens_total", "tokens generated", lambda r: r.completion_tokens),
)


class RequestMetrics:
    """Per model: each SUMMARIES figure's sum, count and quantiles over its last WINDOW requests, and totals."""

    def __init__(self):
        self._recent: dict[str, dict[str, collections.deque]] = {}
        self._sums: collections.Counter = collections.Counter()
        self._counts: collections.Counter = collections.Counter()
        self._totals: collections.Counter = collections.Counter()
        self.requests: collections.Counter = collections.Counter()

    def add(self, model: str, r: Result) -> None:
        self.requests[model] += 1
        recent = self._recent.setdefault(model, {name: collections.deque(maxlen=WINDOW) for name, _, _ in SUMMARIES})
        for name, _, value in SUMMARIES:
            v = value(r)
            if v is not None:
                recent[name].append(v)
                self._sums[(name, model)] += v
                self._counts[(name, model)] += 1
        for name, _, value in COUNTERS:
            self._totals[(name, model)] += value(r)

    def render(self, label) -> Iterator[str]:
        """Prometheus text lines; `label(model)` gives the label set's value (escaped)."""
        yield "# HELP hypura_request_total requests the engine ended (finished, cancelled or failed)"
        yield "# TYPE hypura_request_total counter"
        yield from (f'hypura_request_total{{model="{label(m)}"}} {n}' for m, n in sorted(self.requests.items()))
        for name, doc, _ in SUMMARIES:
            yield f"# HELP {name} {doc}; quantiles over the last {WINDOW} requests"
            yield f"# TYPE {name} summary"
            for model, recent in sorted(self._recent.items()):
                values = sorted(recent[name])
                for q in QUANTILES if values else ():
                    yield f'{name}{{model="{label(model)}",quantile="{q}"}} {_quantile(values, q):.6g}'
                yield f'{name}_sum{{model="{label(model)}"}} {self._sums[(name, model)]:.6g}'
                yield f'{name}_count{{model="{label(model)}"}} {self._counts[(name, model)]}'
        for name, doc, _ in COUNTERS:
            yield f"# HELP {name} {doc}"
            yield f"# TYPE {name} counter"
            yield from (f'{name}{{model="{label(m)}"}} {self._totals[(name, m)]}' for m in sorted(self._recent))


def _quantile(values: list[float], q: float) -> float:
    """The q-quantile of sorted `values` (nearest rank: always one of the requests' own figures)."""
    return values[max(0, math.ceil(q * len(values)) - 1)]
