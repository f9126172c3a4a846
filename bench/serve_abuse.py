"""Attack `hypura serve` as a hostile client, web page or model file would, and check every bound holds.

    python3 bench/serve_abuse.py [-m MODEL] [--rounds N (default 3)] [--seconds S (default 600)] [--json FILE]

Loopback only: it starts its own servers in this process on 127.0.0.1 (port 0) with the real engine and
the model (the default model without -m), and drives them with real HTTP clients. Every loop is counted
(`--rounds` repetitions of each case, 100 slow connections, 50 hang-ups, ...) and the whole run stops
itself after `--seconds`. Each case prints one row, case / expected / seen / ok; the table goes to stderr,
JSON to stdout (and --json FILE); the exit status is 1 if any case failed.

Hostile templates are put in the loaded model's metadata (`tokenizer.chat_template`) before the server
reads it, as a GGUF carrying them would.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import threading
import time

import hypura  # noqa: F401  first: our library loads before numpy

TEMPLATES = {
    "template ((6+n)**65536)**256": "{% set n = messages|length %}{% set x = ((6 + n) ** 65536) ** 256 %}{{ x }}",
    "template '%0200000000d'|format(n)": "{% set n = messages|length %}{{ '%0200000000d' | format(n) }}",
    "template '%*d' % (200000000, n)": "{% set n = messages|length %}{{ '%*d' % (200000000, n) }}",
    "template '{:>{}}'.format(n, '200000000')": "{% set n = messages|length %}{{ '{:>{}}'.format(n, '200000000') }}",
    "template tojson(indent=65536), deep": "{{ %s | tojson(indent=65536) }}" % ("[" * 40 + "1" + "]" * 40),
}
ROWS: list[dict] = []


def row(case: str, expected: str, seen: str, ok: bool) -> None:
    ROWS.append({"case": case, "expected": expected, "seen": seen, "ok": bool(ok)})
    print(f"{'ok ' if ok else 'BAD'} {case:44} | {expected:44} | {seen}", file=sys.stderr, flush=True)


class LogWatch(logging.Handler):
    """Counts the server's log lines and the tracebacks among them."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines, self.tracebacks = [], 0

    def emit(self, record):
        self.lines.append(record.getMessage())
        self.tracebacks += bool(record.exc_info) or "Traceback" in record.getMessage()


def server(model, template=None, **settings):
    from hypura.serve.server import Server, start_engine
    from hypura.serve.settings import ServeSettings

    def starter(path, s):
        llm, engine = start_engine(path, s)
        if template is not None:
            llm.metadata["tokenizer.chat_template"] = template
        return llm, engine

    settings.setdefault("llama_kwargs", {"n_threads": 1, "n_threads_batch": 1})
    s = Server(ServeSettings(models=(model,), host="127.0.0.1", port=0, n_ctx=512, parallel=4, **settings),
               engine_starter=starter, log_level="warning").start()
    deadline = time.monotonic() + 120
    while not s.state.ready:
        if s.state.error or time.monotonic() > deadline:
            raise SystemExit(f"server did not start: {s.state.error}")
        time.sleep(0.05)
    s.model = next(iter(s.state.registry)).name
    return s


class Prober:
    """GET /health every 20 ms while a case runs: the slowest answer says whether the loop was blocked."""

    def __init__(self, url):
        self.url, self.times, self.failed = url, [], 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        import httpx

        with httpx.Client(timeout=30) as c:
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    self.failed += c.get(self.url + "/health").status_code != 200
                except httpx.HTTPError:
                    self.failed += 1
                self.times.append(time.monotonic() - started)
                time.sleep(0.02)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    def worst(self) -> float:
        return max(self.times, default=0.0)

    def seen(self) -> str:
        return f"/health max {self.worst() * 1000:.0f} ms over {len(self.times)}, {self.failed} failed"


def rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def templates(args, watch):
    import httpx

    for case, template in TEMPLATES.items():
        s = server(args.model, template)
        try:
            chat = {"model": s.model, "messages": [{"role": "user", "content": "hi"}], "stream": False}
            with httpx.Client(base_url=s.url, timeout=60) as c, Prober(s.url) as probe:
                c.post("/api/chat", json=chat)
                before, worst, statuses = rss(), 0.0, set()
                for _ in range(9 * args.rounds):
                    started = time.monotonic()
                    statuses.add(c.post("/api/chat", json=chat).status_code)
                    worst = max(worst, time.monotonic() - started)
                grown = (rss() - before) >> 20
            ok = statuses == {500} and worst < 2.5 and grown < 64 and probe.worst() < 1.0 and not probe.failed
            row(case, "500 each < 2.5 s, RSS +< 64 MB, /health < 1 s",
                f"{sorted(statuses)} worst {worst:.2f} s x{9 * args.rounds}, RSS +{grown} MB, {probe.seen()}", ok)
        finally:
            s.stop()


def tokenization(s, args):
    import httpx

    cases = [("raw /api/generate '<|im_end|>x' * 32000", "/api/generate",
              {"prompt": "<|im_end|>x" * 32_000, "raw": True, "stream": False}),
             ("/api/chat, 100k one-character messages", "/api/chat",
              {"messages": [{"role": "user", "content": "a"}] * 100_000, "stream": False}),
             ("/api/chat, 8 MB prompt", "/api/chat",
              {"messages": [{"role": "user", "content": "x" * ((8 << 20) - 200)}], "stream": False})]
    with httpx.Client(base_url=s.url, timeout=120) as c:
        for case, path, body in cases:
            with Prober(s.url) as probe:
                worst, statuses = 0.0, set()
                for _ in range(args.rounds):
                    started = time.monotonic()
                    statuses.add(c.post(path, json={"model": s.model, **body}).status_code)
                    worst = max(worst, time.monotonic() - started)
            row(case, "400 < 5 s, /health < 1 s", f"{sorted(statuses)} worst {worst:.2f} s, {probe.seen()}",
                statuses == {400} and worst < 5 and probe.worst() < 1.0)


def web(s):
    import httpx

    engine = next(iter(s.state.registry)).engine
    with httpx.Client(base_url=s.url, timeout=30) as c:
        r = c.get("/api/tags", headers={"Host": "rebind.evil.example"})
        row("DNS rebinding: Host rebind.evil.example", "403", str(r.status_code), r.status_code == 403)
        n = engine.metrics()["requests"]["total"]
        r = c.post("/api/generate", content=json.dumps({"model": s.model, "prompt": "hi"}),
                   headers={"Origin": "https://evil.example", "Content-Type": "text/plain"})
        after = engine.metrics()["requests"]["total"]
        row("web page POST text/plain, Origin evil", "403, no engine request",
            f"{r.status_code}, {after - n} engine requests", r.status_code == 403 and after == n)
        r = c.options("/v1/chat/completions", headers={"Origin": "http://localhost:3000",
                                                       "Access-Control-Request-Method": "POST",
                                                       "Access-Control-Request-Headers": "authorization"})
        row("CORS preflight from http://localhost:3000", "204 + Allow-Origin/Methods/Headers",
            f"{r.status_code} {r.headers.get('access-control-allow-origin')} "
            f"[{r.headers.get('access-control-allow-methods')}] [{r.headers.get('access-control-allow-headers')}]",
            r.status_code == 204 and r.headers.get("access-control-allow-origin") == "http://localhost:3000")


def mistakes(s, args, watch):
    import httpx

    bodies = {"lone surrogate": '{"model": "%s", "prompt": "a\\ud800b"}' % s.model,
              "100k-deep JSON": '{"model": "%s", "x": ' % s.model + "[" * 100_000 + "]" * 100_000 + "}",
              "5,000-digit integer": '{"model": "%s", "prompt": "x", "seed": %s}' % (s.model, "9" * 5000)}
    before = watch.tracebacks
    with httpx.Client(base_url=s.url, timeout=30) as c:
        for case, body in bodies.items():
            statuses = {c.post(path, content=body.encode(), headers={"Content-Type": "application/json"}).status_code
                        for path in ("/api/generate", "/v1/completions") for _ in range(args.rounds)}
            row(case, "400, no traceback", f"{sorted(statuses)}, {watch.tracebacks - before} tracebacks",
                statuses == {400} and watch.tracebacks == before)
    lines = len([m for m in watch.lines if "left before sending its whole body" in m])
    for _ in range(50):
        c = socket.create_connection(("127.0.0.1", s.port))
        c.sendall(b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n{\"model\":")
        time.sleep(0.01)
        c.close()
    time.sleep(1)
    lines = len([m for m in watch.lines if "left before sending its whole body" in m]) - lines
    row("50 clients hang up mid-body", "50 one-line logs, no traceback",
        f"{lines} lines, {watch.tracebacks - before} tracebacks", lines == 50 and watch.tracebacks == before)


def slow_clients(args):
    s = server(args.model, timeout_s=2.0)
    try:
        import httpx

        with Prober(s.url) as probe:
            started = time.monotonic()
            conns = []
            for i in range(100):
                c = socket.create_connection(("127.0.0.1", s.port))
                c.sendall(b"GET /api/tags HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                conns.append(c)
            for c in conns[:20]:
                c.sendall(b"X-Slow: 1\r\n")
            closed = 0
            for c in conns:
                c.settimeout(15)
                try:
                    closed += c.recv(10) == b""
                except OSError:
                    pass
                c.close()
            took = time.monotonic() - started
            body = socket.create_connection(("127.0.0.1", s.port))
            body.sendall(b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{")
            body.settimeout(15)
            answer = body.recv(200).split(b"\r\n")[0].decode()
            body.close()
        row("100 slowloris connections, --timeout 2", "all closed in ~2 s, /health < 1 s",
            f"{closed} closed in {took:.1f} s, {probe.seen()}", closed == 100 and took < 6 and probe.worst() < 1)
        row("a body that stalls, --timeout 2", "408", answer, " 408 " in answer)
        key = server(args.model, api_key="k3y")
        try:
            r = httpx.get(key.url + "/api/tags", headers={"Authorization": "bearer k3y"})
            row("Authorization: bearer KEY (lower case)", "200", str(r.status_code), r.status_code == 200)
        finally:
            key.stop()
    finally:
        s.stop()


def shutdown(args):
    import httpx

    s = server(args.model)
    results = []

    def stream(path, body):
        with httpx.Client(base_url=s.url, timeout=60) as c:
            results.append(c.post(path, json={"model": s.model, **body}).text)

    chat = {"messages": [{"role": "user", "content": "Tell a very long story."}], "stream": True,
            "options": {"num_predict": 100_000}, "max_tokens": 100_000, "ignore_eos": True}
    threads = [threading.Thread(target=stream, args=("/api/chat" if i % 2 else "/v1/chat/completions", chat))
               for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(3)
    started = time.monotonic()
    s.stop()
    took = time.monotonic() - started
    for t in threads:
        t.join(10)
    ended = sum(r.rstrip().endswith('{"error":"the server is shutting down"}') or r.rstrip().endswith("data: [DONE]")
                and "shutting down" in r for r in results)
    row("stop with 8 open streams", "each ends with an error chunk (+[DONE]) < 5 s",
        f"{ended}/8 ended so, stop took {took:.1f} s", ended == 8 and took < 5)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-m", "--model", default=None)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.model is None:
        from hypura.models import default_model_path

        args.model = default_model_path()
    watch = LogWatch()
    for name in ("hypura.serve", "uvicorn.error"):
        logging.getLogger(name).addHandler(watch)
    logging.getLogger("hypura.serve").setLevel(logging.INFO)
    timer = threading.Timer(args.seconds, lambda: (print("out of time", file=sys.stderr), os._exit(2)))
    timer.daemon = True
    timer.start()
    started = time.monotonic()
    s = server(args.model)
    try:
        tokenization(s, args)
        web(s)
        mistakes(s, args, watch)
    finally:
        s.stop()
    templates(args, watch)
    slow_clients(args)
    shutdown(args)
    out = {"rows": ROWS, "seconds": round(time.monotonic() - started, 1), "rounds": args.rounds}
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    sys.exit(0 if all(r["ok"] for r in ROWS) else 1)


if __name__ == "__main__":
    main()
