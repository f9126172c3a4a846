"""Time to first token of one long prompt through an HTTP server: `hypura serve` or vanilla `llama-server`.

    python3 bench/serve_ttft.py MODEL --port 8091 [--tokens 4096] [--repeats 3] [--json FILE] -- SERVER COMMAND...

Starts the server command (it must listen on 127.0.0.1:PORT), waits until /v1/models answers, sends one short
warm-up completion, then `--repeats` prompts of `--tokens` token ids each through /v1/completions (streamed,
one token), timing from the request to the first streamed chunk. Both servers take a prompt as token ids, so
each side gets exactly the same tokens: ids of a long text (MODEL's vocabulary, read here), cut to the length, with a different first token for every repeat so no prompt cache serves another's prefix. Prints the
median (min-max) and writes the JSON, the server's log beside it (FILE.log: its plan, micro-batch, load); on failure
the log's end goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from server_process import ServerProcess, httpx, wait_model

TEXT = " ".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog near river {i % 97}." for i in range(3000))
READY_TIMEOUT_S = 600  # a 40 GB model read from a cold disk takes minutes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="the GGUF the server serves (its vocabulary makes the prompt)")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", dest="json_path")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args, command = ap.parse_args(argv[:split]), argv[split + 1:]
    if not command:
        ap.error("the server command follows --")
    base = f"http://127.0.0.1:{args.port}"
    server = ServerProcess(command)
    try:
        with server:
            result = _measure(base, server.process, args)
    except Exception as e:
        sys.stderr.write(server.log[-4000:])
        print(f"error: {e}", file=sys.stderr)
        return 1
    server_log = server.log
    result["command"] = " ".join(command)
    ttft = result["ttft_s"]
    print(f"ttft {args.tokens} tokens: {statistics.median(ttft):.3f} s ({min(ttft):.3f}-{max(ttft):.3f}), "
          f"{args.tokens / statistics.median(ttft):.0f} tok/s; ready after {result['ready_s']:.1f} s")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(result, f, indent=1)
        with open(args.json_path + ".log", "w") as f:
            f.write(server_log)
    return 0


def _measure(base: str, server: subprocess.Popen, args) -> dict:
    started = time.perf_counter()
    with httpx.Client(base_url=base, timeout=READY_TIMEOUT_S) as client:
        model = wait_model(client, server, READY_TIMEOUT_S)
        ready = time.perf_counter() - started
        _first_chunk(client, model, "Hello", max_tokens=4)  # the warm-up: kernels, graphs, the first-use profile
        ids = _token_ids(args.model)
        if len(ids) < args.tokens + args.repeats:
            raise RuntimeError(f"the text gives {len(ids)} tokens, fewer than --tokens {args.tokens}")
        ttft = [_first_chunk(client, model, ids[r:r + args.tokens]) for r in range(args.repeats)]
    return {"tokens": args.tokens, "ttft_s": ttft, "ready_s": ready}


def _token_ids(model: str) -> list[int]:
    import hypura  # noqa: F401  first: our library loads before llama_cpp's
    from llama_cpp import Llama

    vocab = Llama(model, vocab_only=True, verbose=False)
    try:
        return vocab.tokenize(TEXT.encode(), add_bos=False)
    finally:
        vocab.close()


def _first_chunk(client: httpx.Client, model: str, prompt, max_tokens: int = 1) -> float:
    """Seconds from the request to the first streamed data line."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "temperature": 0}
    t0 = time.perf_counter()
    first = None
    with client.stream("POST", "/v1/completions", json=body) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():  # read to the end, so the next request finds the server idle
            if first is None and line.startswith("data:") and line.strip() != "data: [DONE]":
                first = time.perf_counter() - t0
    if first is not None:
        return first
    raise RuntimeError("the stream ended without data")


if __name__ == "__main__":
    sys.exit(main())
