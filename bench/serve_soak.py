"""A soak of `hypura serve`: N clients sending mixed requests for M minutes while read faults come and go, every
request's outcome counted, what each server holds sampled.

    python3 bench/serve_soak.py [--minutes 60] [--clients 16] [--seed 0] [--json FILE] [--note TEXT]

Two `hypura serve` processes on 127.0.0.1 (free ports), one thread each (`-t 1`):
  - "smollm2": a copy of SmolLM2-135M as the default path places it, -np 4, the copy replaced by another (the
    same bytes, a new inode) at random (mean --replace-s): the server loads it again under its clients;
  - "streamed": a synthetic tiny-llama under a --ram budget that streams its layers from disk at every token,
    with tests/eio_shim.c preloaded: its reads of the model file fail with EIO while a trigger file exists. A
    thread creates and removes the trigger at random (exponential intervals, mean --fault-s).
Each client loops until the deadline on its server (half the clients each): a random route (OpenAI /v1/completions and /v1/chat/completions,
Ollama /api/generate and /api/chat; chat only where the model has a template), streamed or not, a short prompt
or one of ~1k tokens, and a quarter of the streams left after a few chunks (cancelled). Outcomes: "answered" (a
whole answer), "error" (a 4xx/5xx with an error body, or a stream's error chunk), "cancelled", and anything else
is a "failure" (a dropped connection, a stream that stops without its end, a timeout, a body that is not the
API's). RSS, descriptors and threads of both servers are sampled every 10 s (RSS at the end of each tenth of the
run, and when the file was replaced, kept apart in the JSON). Memory here is bounded: counters,
at most MAX_EXAMPLES failures kept, one sample per 10 s. Exit status 1 on any failure, a traceback in a server's
log, or a server that did not stop cleanly.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the shim's build and environment, the server helpers: one place

from injected_faults import budget, build_shim, faulted_env, held, streams_layers  # noqa: E402
from serve_helpers import free_port, stop, wait_ready  # noqa: E402

SAMPLE_S = 10
IDLE_S = 10  # after the last client: then what each server holds, idle
MAX_EXAMPLES = 50  # failures kept whole in the JSON; the rest are counted
N_CTX = 2048  # per sequence: a ~1k-token prompt and its reply
LONG = " ".join(f"Item {i}: the quick brown fox jumps over the lazy dog near the river bank." for i in range(70))
SHORT = "Once upon a time"
CLIENT_TIMEOUT_S = 300


class Tally:
    """Outcome counts by (server, route, stream, prompt, outcome), and the first failures, under one lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.counts: collections.Counter = collections.Counter()
        self.slowest: dict[str, float] = {}  # outcome -> the longest request's seconds
        self.examples: list[dict] = []

    def add(self, key: tuple, outcome: str, seconds: float, detail: str = "") -> None:
        with self.lock:
            self.counts[(*key, outcome)] += 1
            self.slowest[outcome] = round(max(seconds, self.slowest.get(outcome, 0.0)), 2)
            if outcome == "failure" and len(self.examples) < MAX_EXAMPLES:
                self.examples.append({"request": " ".join(map(str, key)), "detail": detail[:500]})


def _body(route: str, model: str, prompt: str, stream: bool, n: int) -> dict:
    if route == "/v1/completions":
        return {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0.7, "stream": stream}
    if route == "/v1/chat/completions":
        return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": n, "stream": stream}
    options = {"num_predict": n, "temperature": 0.7}
    if route == "/api/generate":
        return {"model": model, "prompt": prompt, "raw": True, "stream": stream, "options": options}
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "stream": stream, "options": options}


def _error_body(r: httpx.Response) -> bool:
    try:
        return r.status_code >= 400 and "error" in r.json()
    except ValueError:
        return False


def _chunk(line: str, openai: bool):
    """A stream line as (done, error, data); None for a line that carries nothing (blank, SSE comment)."""
    if openai:
        if not line.startswith("data: "):
            return None
        if line == "data: [DONE]":
            return True, False, None
        data = json.loads(line[len("data: "):])
        return False, "error" in data, data
    if not line.strip():
        return None
    data = json.loads(line)
    return bool(data.get("done")), "error" in data, data


def one_request(client: httpx.Client, route: str, body: dict, cancel_after: int) -> tuple[str, str]:
    """(outcome, detail) of one request."""
    openai = route.startswith("/v1/")
    try:
        if not body["stream"]:
            r = client.post(route, json=body)
            if r.status_code == 200:
                data = r.json()
                whole = "choices" in data if openai else data.get("done") is True
                return ("answered", "") if whole else ("failure", f"200 without an answer: {r.text[:200]}")
            return ("error", "") if _error_body(r) else ("failure", f"{r.status_code}: {r.text[:200]}")
        with client.stream("POST", route, json=body) as r:
            if r.status_code != 200:
                r.read()
                return ("error", "") if _error_body(r) else ("failure", f"{r.status_code}: {r.text[:200]}")
            seen, errored = 0, False
            for line in r.iter_lines():
                got = _chunk(line, openai)
                if got is None:
                    continue
                done, error, _ = got
                errored |= error
                if done or (error and not openai):  # Ollama's error line is its last
                    return ("error", "") if errored else ("answered", "")
                seen += 1
                if cancel_after and seen >= cancel_after and not errored:
                    return "cancelled", ""  # leaving the block closes the connection mid-stream
            return ("error", "") if errored else ("failure", f"the stream ended without its end after {seen} chunks")
    except (httpx.HTTPError, ValueError) as e:
        return "failure", f"{type(e).__name__}: {e}"


def client_loop(i: int, servers: dict, deadline: float, tally: Tally, seed: int) -> None:
    rng = random.Random(seed * 1000 + i)
    name = sorted(servers)[i % len(servers)]  # its own server: a slow one does not starve the other of clients
    server = servers[name]
    client = httpx.Client(base_url=server["url"], timeout=CLIENT_TIMEOUT_S)
    try:
        while time.monotonic() < deadline:
            route = rng.choice(server["routes"])
            stream = rng.random() < 0.5
            long = rng.random() < 0.25
            cancel_after = rng.randint(1, 4) if stream and rng.random() < 0.25 else 0
            body = _body(route, server["model"], LONG if long else SHORT, stream, rng.choice((8, 16, 32)))
            t0 = time.monotonic()
            outcome, detail = one_request(client, route, body, cancel_after)
            tally.add((name, route, "stream" if stream else "whole", "long" if long else "short"), outcome,
                      time.monotonic() - t0, detail)
    finally:
        client.close()


def fault_loop(trigger: Path, mean_s: float, stop_at: threading.Event, rng: random.Random, toggles: list) -> None:
    while not stop_at.wait(rng.expovariate(1 / mean_s)):
        if trigger.exists():
            trigger.unlink()
        else:
            trigger.touch()
        toggles[0] += 1
    trigger.unlink(missing_ok=True)


def replace_loop(path: Path, source: Path, mean_s: float, stop_at: threading.Event, rng: random.Random,
                 times: list, started: float) -> None:
    while not stop_at.wait(rng.expovariate(1 / mean_s)):
        fresh = path.with_name(path.name + ".new")
        shutil.copyfile(source, fresh)
        fresh.replace(path)  # a new inode under the same name
        times.append(round(time.monotonic() - started, 1))


def sample_loop(servers: dict, stop_at: threading.Event, samples: collections.deque, started: float) -> None:
    while True:
        row = {"s": round(time.monotonic() - started, 1)}
        for name, s in servers.items():
            try:
                rss, fds, threads = held(s["proc"].pid)
                row[name] = {"rss_mib": round(rss / 2**20, 1), "fds": fds, "threads": threads}
            except (OSError, StopIteration):
                row[name] = None  # the process is gone: its exit status says why
        samples.append(row)
        if stop_at.wait(SAMPLE_S):
            return


def start_server(name: str, argv: list, env: dict, log: Path) -> dict:
    port = free_port()
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "hypura.cli.main", "serve", *argv, "--port", str(port),
                                 "-t", "1", "-c", str(N_CTX)], env=env, stdout=subprocess.DEVNULL, stderr=err)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, url, limit_s=300)
    except AssertionError as e:
        proc.kill()
        raise SystemExit(f"error: the {name} server did not start ({e}):\n{log.read_text()[-2000:]}") from None
    model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
    return {"name": name, "proc": proc, "url": url, "model": model, "log": log}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--fault-s", type=float, default=5.0, help="mean seconds between fault toggles")
    ap.add_argument("--replace-s", type=float, default=300.0,
                    help="mean seconds between replacements of SmolLM2's file (0: never)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--note", default="", help="what else ran on the machine meanwhile (kept in the JSON)")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()

    from hypura.models import default_model_path
    from hypura.synth import write_synth

    with tempfile.TemporaryDirectory(prefix="serve-soak-") as tmp:
        tmp = Path(tmp)
        tiny, trigger, smol = tmp / "tiny-llama.gguf", tmp / "faults-on", tmp / "smollm2.gguf"
        shutil.copyfile(default_model_path(), smol)
        write_synth("tiny-llama", tiny)
        shim = build_shim(tmp)
        env = {**faulted_env(shim, tiny, trigger=trigger), "HYPURA_API_KEY": ""}
        servers = {}
        try:
            servers["smollm2"] = start_server("smollm2", ["-m", str(smol), "-np", "4"],
                                              {**env, "LD_PRELOAD": ""}, tmp / "smollm2.log")
            servers["smollm2"]["routes"] = ["/v1/completions", "/v1/chat/completions", "/api/generate", "/api/chat"]
            ram = budget(tiny, 2 * N_CTX, streams_layers)  # the plan holds both sequences' context
            servers["streamed"] = start_server("streamed", ["-m", str(tiny), "--ram", ram, "-np", "2"], env,
                                               tmp / "streamed.log")
            servers["streamed"]["routes"] = ["/v1/completions", "/api/generate"]  # no chat template in a synth
            servers["smollm2"]["file"] = smol
            result = soak(args, servers, trigger, default_model_path())
        finally:
            status = {name: stop(s["proc"]) for name, s in servers.items()}
        logs = {name: s["log"].read_text(errors="replace") for name, s in servers.items()}
    result["exit_status"] = status
    result["tracebacks"] = {name: text.count("Traceback") for name, text in logs.items()}
    result["log_tails"] = {name: text[-2000:] for name, text in logs.items() if "Traceback" in text}
    totals = result["totals"]
    # RSS from the first sample past a quarter of the run (at most a minute: warm-up) to the server's, idle after
    warm = min(60.0, args.minutes * 15)
    rss = {name: [row[name]["rss_mib"] for row in result["samples"] if row.get(name) and row["s"] >= warm]
           for name in servers}
    drift = ", ".join(f"{n} RSS {v[0]:.0f} -> {result['idle_after'][n]['rss_mib']:.0f} MiB idle (max {max(v):.0f}) "
                      f"from {warm:.0f} s" for n, v in rss.items() if v)
    bad = totals["failure"] or any(result["tracebacks"].values()) or any(status.values())
    result["summary"] = (f"serve soak {args.minutes:g} min, {args.clients} clients: {sum(totals.values())} requests, "
                         f"{totals['answered']} answered, {totals['error']} error bodies, {totals['cancelled']} "
                         f"cancelled, {totals['failure']} failures; {result['fault_toggles']} fault toggles, "
                         f"{result['file_replacements']} file replacements; {drift}; "
                         f"tracebacks {sum(result['tracebacks'].values())}, exit {sorted(set(status.values()))}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(result["summary"])
    return 1 if bad else 0


def soak(args, servers: dict, trigger: Path, source: Path) -> dict:
    tally, samples, toggles, replaced = Tally(), collections.deque(maxlen=100_000 // SAMPLE_S), [0], []
    stop_at, started = threading.Event(), time.monotonic()
    deadline = started + args.minutes * 60
    helpers = [threading.Thread(target=sample_loop, args=(servers, stop_at, samples, started)),
               threading.Thread(target=fault_loop, args=(trigger, args.fault_s, stop_at,
                                                         random.Random(args.seed), toggles))]
    if args.replace_s > 0:
        helpers.append(threading.Thread(target=replace_loop, args=(servers["smollm2"]["file"], source, args.replace_s,
                                                                   stop_at, random.Random(args.seed + 1), replaced,
                                                                   started)))
    clients = [threading.Thread(target=client_loop, args=(i, servers, deadline, tally, args.seed))
               for i in range(args.clients)]
    for t in helpers + clients:
        t.start()
    for t in clients:
        t.join()
    stop_at.set()
    for t in helpers:
        t.join()
    time.sleep(IDLE_S)  # the copies of a replaced file close once their requests end
    idle = {name: dict(zip(("rss_mib", "fds", "threads"), held(s["proc"].pid))) for name, s in servers.items()}
    for row in idle.values():
        row["rss_mib"] = round(row["rss_mib"] / 2**20, 1)
    totals = collections.Counter({"answered": 0, "error": 0, "cancelled": 0, "failure": 0})
    for key, n in tally.counts.items():
        totals[key[-1]] += n
    return {
        "scenario": "serve-soak", "date": time.strftime("%Y-%m-%d"), "minutes": args.minutes,
        "clients": args.clients, "fault_mean_s": args.fault_s, "replace_mean_s": args.replace_s, "seed": args.seed,
        "command": (f"python3 bench/serve_soak.py --minutes {args.minutes:g} --clients {args.clients} "
                    f"--fault-s {args.fault_s:g} --replace-s {args.replace_s:g}"),
        "servers": {n: {"model": s["model"], "routes": s["routes"]} for n, s in servers.items()},
        "seconds": round(time.monotonic() - started, 1), "fault_toggles": toggles[0], "file_replacements": len(replaced),
        "replaced_at_s": replaced, "note": args.note, "rss_by_tenth": _tenths(list(samples), servers, args.minutes),
        "totals": dict(totals),
        "slowest_s": tally.slowest, "by_request": {" ".join(k): n for k, n in sorted(tally.counts.items())},
        "failures": tally.examples, "samples": list(samples), "idle_after": idle,
    }


def _tenths(samples: list, servers: dict, minutes: float) -> dict:
    """Each server's RSS (MiB) at the end of each tenth of the run: its drift over time, in ten numbers."""
    out = {}
    for name in servers:
        rows = [(row["s"], row[name]["rss_mib"]) for row in samples if row.get(name)]
        out[name] = [next((rss for s, rss in reversed(rows) if s <= minutes * 6 * k), None) for k in range(1, 11)]
    return out


if __name__ == "__main__":
    sys.exit(main())
