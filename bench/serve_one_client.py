"""One client's decode tok/s through `hypura serve` beside `hypura-cli` on the same model.

    python3 bench/serve_one_client.py [MODEL] [--tokens 128] [--repeats 5] [--threads N] [--json FILE]
        [-- extra hypura serve flags, e.g. -np 16]

Starts `hypura serve -m MODEL` (default -np unless given after --) on a free port of 127.0.0.1, sends one
warm-up completion, then alternates `--repeats` times: `hypura-cli -p PROMPT -n TOKENS` (greedy, ignore-eos;
its decode tok/s is llama.cpp's own "eval time" line) and one streamed greedy /v1/completions of the same
prompt and length (its decode tok/s: the tokens after the first over the time from the first streamed chunk
to the last, as llama.cpp's eval line counts the tokens after the prompt's). Alternating keeps a drifting,
shared machine fair to both. Prints the median (min-max) of each, the ratio of the medians and the ratio pair
by pair, and where the served run's time went inside the server (from /metrics: the engine's decode steps,
llama_decode alone); JSON with every run to --json FILE, the server's log beside it (FILE.log). On a shared
2-core machine give --threads 1: two llama.cpp threads wait for each other behind other processes.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time

import httpx

from server_process import ServerProcess, free_port, wait_model

PROMPT = "Once upon a time"
READY_TIMEOUT_S = 300
EVAL_LINE = re.compile(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs")  # llama.cpp's common_perf_print


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", help="GGUF (default: hypura's default model)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, help="-t for both (default: each one's own default)")
    ap.add_argument("--json", dest="json_path")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args, serve_flags = ap.parse_args(argv[:split]), argv[split + 1:]
    if args.model is None:
        from hypura.models import default_model_path

        args.model = str(default_model_path())
    threads = ["-t", str(args.threads)] if args.threads else []
    port = free_port()
    command = ["hypura", "serve", "-m", args.model, "--port", str(port), *threads, *serve_flags]
    server = ServerProcess(command)
    try:
        with server:
            runs = _measure(f"http://127.0.0.1:{port}", server.process, args, threads)
    except Exception as e:
        sys.stderr.write(server.log[-4000:])
        print(f"error: {e}", file=sys.stderr)
        return 1
    server_log = server.log
    served, cli = runs["served_tok_s"], runs["cli_tok_s"]
    ratios = [s / c for s, c in zip(served, cli)]
    result = {"model": args.model, "tokens": args.tokens, "serve_command": " ".join(command), **runs,
              "ratio_of_medians": statistics.median(served) / statistics.median(cli), "ratios": ratios}
    print(f"served {_spread(served)} tok/s, hypura-cli {_spread(cli)} tok/s, served/cli "
          f"{result['ratio_of_medians']:.3f} (pairs {_spread(ratios, 3)}); in the server: engine decode steps "
          f"{_spread(runs['engine_steps_tok_s'])}, llama_decode {_spread(runs['llama_decode_tok_s'])} tok/s")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(result, f, indent=1)
        with open(args.json_path + ".log", "w") as f:
            f.write(server_log)
    return 0


def _spread(values: list[float], digits: int = 1) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def _measure(base: str, server: subprocess.Popen, args, threads: list[str]) -> dict:
    with httpx.Client(base_url=base, timeout=READY_TIMEOUT_S) as client:
        model = wait_model(client, server, READY_TIMEOUT_S)
        _served(client, model, 8)  # the warm-up: first-use work, the prompt's KV cached as every later run finds it
        served, cli, engine, decode = [], [], [], []
        for _ in range(args.repeats):
            cli.append(_cli(args.model, args.tokens, threads))
            before = _decode_counters(client)
            served.append(_served(client, model, args.tokens))
            after = _decode_counters(client)
            rate = {k: (after[k] - before[k]) / (after[k + "_s"] - before[k + "_s"]) for k in ("steps", "calls")}
            engine.append(rate["steps"])
            decode.append(rate["calls"])
    return {"served_tok_s": served, "cli_tok_s": cli, "engine_steps_tok_s": engine, "llama_decode_tok_s": decode}


def _decode_counters(client: httpx.Client) -> dict:
    """The server's decode counters: the engine's decode steps (whole steps) and llama_decode alone, in them."""
    names = {"hypura_engine_decode_tokens": "steps", "hypura_engine_decode_seconds": "steps_s",
             "hypura_engine_llm_decode_tokens": "calls", "hypura_engine_llm_decode_seconds": "calls_s"}
    out = {}
    for line in client.get("/metrics").text.splitlines():
        name, _, value = line.partition("{")
        if name in names:
            out[names[name]] = float(value.rsplit(" ", 1)[1])
    return out


def _served(client: httpx.Client, model: str, tokens: int) -> float:
    """Decode tok/s of one streamed greedy completion: tokens after the first over first-to-last chunk."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    first = last = None
    completion = 0
    with client.stream("POST", "/v1/completions", json=body) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk.get("choices"):
                last = time.perf_counter()
                first = first or last
            if chunk.get("usage"):
                completion = chunk["usage"]["completion_tokens"]
    if completion < 2 or last == first:
        raise RuntimeError(f"the stream gave {completion} tokens")
    return (completion - 1) / (last - first)


def _cli(model: str, tokens: int, threads: list[str]) -> float:
    out = subprocess.run(["hypura-cli", "-m", model, "-p", PROMPT, "-n", str(tokens), "--temp", "0",
                          "--ignore-eos", "-no-cnv", *threads], capture_output=True, text=True, check=True)
    match = EVAL_LINE.search(out.stderr + out.stdout)
    if match is None:
        raise RuntimeError("hypura-cli printed no eval time line")
    ms, runs = float(match.group(1)), int(match.group(2))
    return runs / ms * 1000


if __name__ == "__main__":
    sys.exit(main())
