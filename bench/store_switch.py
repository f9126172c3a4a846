"""Models by name, loaded on demand: `hypura serve` with no model flags over an Ollama store of two models,
timing each model's first request (its load included), a warm request, and switches between them.

    python3 -m bench.store_switch STORE [--make NAME=GGUF ...] [--tokens 32] [-c 4096] [-np 1] [-t N]
        [--gpu-mem SIZE --ram SIZE] [--json FILE]

--make writes each GGUF into STORE as Ollama stores it (blobs/sha256-<hex>, hard-linked where it can be,
and a manifest under manifests/registry.ollama.ai/library/NAME/TAG); without it, STORE's own models are
used (the first two /api/tags lists, or the --make names in order). The server runs as a user runs it
(`OLLAMA_MODELS=STORE hypura serve`, on 127.0.0.1 and a free port), so each load is planned within the
memory free then, beside what stays; the server's lines saying what it loaded, planned and unloaded are
printed after each step. Steps: A first, A warm, B first (the switch), B warm, A again. Reported per step:
wall time, the model's load time (/api/ps), decode tok/s (eval_count / eval_duration), what is loaded
after; a table on stderr, JSON on stdout (and --json FILE). Where both models fit, the second loads
beside the first, planned within what it leaves; to make each switch unload the other, pin the free memory
the server sees (it is passed on): HYPURA_FREE_MEMORY=gpu=48GiB python3 -m bench.store_switch ...

    python3 -m bench.store_switch /tmp/store --make llama3.3:70b=/tmp/l70.gguf --make qwen3:30b-a3b=/tmp/q3.gguf
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the store writer the CI tests use
from ollama_store import add_model  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper."
REQUEST_TIMEOUT_S = 3600  # a first request loads the model: a 70B from disk takes minutes
# raw prompts: synthetic models have no chat template


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class ServerLog:
    """The server's stderr, in a file; `new()` returns the lines since the last call."""

    def __init__(self):
        self.file = tempfile.NamedTemporaryFile("w+", prefix="hypura-serve-", suffix=".log", delete=False)
        self.pos = 0

    def new(self) -> list[str]:
        with open(self.file.name) as f:
            f.seek(self.pos)
            text = f.read()
            self.pos = f.tell()
        return [line for line in text.splitlines() if line.strip()]


def start_server(args, store: Path, log: ServerLog) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "hypura.cli.main", "serve", "--port", str(port), "-c", str(args.ctx),
           "-np", str(args.parallel), "--log-level", "info"]
    cmd += ["-t", str(args.threads)] if args.threads else []
    cmd += ["--gpu-mem", args.gpu_mem] if args.gpu_mem else []
    cmd += ["--ram", args.ram] if args.ram else []
    env = {**os.environ, "OLLAMA_MODELS": str(store)}
    proc = subprocess.Popen(cmd, stdout=log.file, stderr=log.file, env=env, text=True)
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(proc, url: str, timeout: float = 120.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"hypura serve exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"hypura serve not ready in {timeout:.0f} s")
        time.sleep(0.2)


def step(client, name: str, model: str, tokens: int, log: ServerLog) -> dict:
    started = time.perf_counter()
    r = client.post("/api/generate", json={"model": model, "prompt": PROMPT, "stream": False, "raw": True,
                                           "options": {"num_predict": tokens, "temperature": 0}})
    wall = time.perf_counter() - started
    if r.status_code != 200:
        raise SystemExit(f"{name} ({model}): HTTP {r.status_code}: {r.text[:500]}")
    body = r.json()
    ps = {m["name"]: m for m in client.get("/api/ps").json()["models"]}
    entry = ps.get(model) or next((m for m in ps.values() if m["name"].startswith(model)), {})
    hyp = entry.get("hypura", {})
    row = {"step": name, "model": model, "wall_s": round(wall, 3), "load_s": hyp.get("load_s"),
           "decode_tok_s": round(body["eval_count"] / (body["eval_duration"] / 1e9), 2) if body["eval_count"] else None,
           "tokens": body["eval_count"], "loaded_after": sorted(ps), "plan": hyp.get("plan", ""),
           "server_log": log.new()}
    for line in row["server_log"]:
        _say(f"    server: {line}")
    decode = f"{row['decode_tok_s']:8.2f} tok/s" if row["decode_tok_s"] else "no tokens"
    _say(f"  {name:<10} {model:<28} {wall:8.2f} s  load {row['load_s'] or 0:7.2f} s  decode {decode}  "
         f"loaded: {', '.join(row['loaded_after'])}")
    _say(f"             plan: {row['plan']}")
    return row


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python3 -m bench.store_switch", description=__doc__.split("\n\n")[0])
    p.add_argument("store", type=Path, help="Ollama store folder (OLLAMA_MODELS)")
    p.add_argument("--make", action="append", default=[], metavar="NAME=GGUF",
                   help="write GGUF into the store as NAME (name:tag) first; give two")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("-c", "--ctx", type=int, default=4096, help="context per sequence (hypura serve -c)")
    p.add_argument("-np", "--parallel", type=int, default=1)
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("--gpu-mem", default=None)
    p.add_argument("--ram", default=None)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)

    import httpx

    names = []
    for spec in args.make:
        name, sep, gguf = spec.partition("=")
        if not sep or not Path(gguf).is_file():
            raise SystemExit(f"--make {spec}: want NAME=PATH of a GGUF file")
        add_model(args.store, name, Path(gguf))
        names.append(name)
    log = ServerLog()
    proc, url = start_server(args, args.store, log)
    rows = []
    try:
        wait_ready(proc, url)
        with httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT_S) as client:
            offered = [m["name"] for m in client.get("/api/tags").json()["models"]]
            models = names or offered[:2]
            if len(models) < 2:
                raise SystemExit(f"the store offers {offered}: two models are needed (--make NAME=GGUF twice)")
            a, b = models[:2]
            _say(f"hypura serve over {args.store}: offers {', '.join(offered)}")
            for line in log.new():
                _say(f"    server: {line}")
            for name, model in (("A first", a), ("A warm", a), ("B switch", b), ("B warm", b), ("A again", a)):
                rows.append(step(client, name, model, args.tokens, log))
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    out = {"store": str(args.store), "tokens": args.tokens, "ctx": args.ctx, "parallel": args.parallel,
           "steps": rows}
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
