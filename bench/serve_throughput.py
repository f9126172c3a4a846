"""What HTTP costs: aggregate generation through `hypura serve` beside the engine driven directly.

    python3 bench/serve_throughput.py [MODEL] [--clients 16] [--parallel 4] [--tokens 32] [--threads N]
        [--gpu-mem 8GiB --ram 64GiB]

Both runs load the model the same way (hypura.engine.load: `parallel` sequences, the budgets' plan) and
generate `--tokens` tokens for each of `--clients` requests with ignore_eos, so that every request is
as long as asked. First the engine alone (submit all, wait for all), then the same requests from as
many concurrent `openai` clients (AsyncOpenAI, /v1/completions, streaming) against the server on
127.0.0.1. Printed: requests/s and generated tok/s of each, the served/engine ratio, and the served
time to first token (median over the clients; they all start at once, so it includes the queue).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import hypura  # noqa: F401  first: our library loads before numpy

PROMPTS = [f"Write a short story about the number {i}." for i in range(1024)]


def engine_run(args) -> dict:
    from hypura.engine import SamplingParams, load

    llm, engine = load(args.model, args.parallel, args.ctx, gpu_mem=args.gpu_mem, ram=args.ram, **_threads(args))
    try:
        params = SamplingParams(max_tokens=args.tokens, ignore_eos=True, seed=0)
        warm = engine.submit(engine.tokenize(PROMPTS[-1]), params)
        warm.result()
        started = time.perf_counter()
        requests = [engine.submit(engine.tokenize(PROMPTS[i]), params) for i in range(args.clients)]
        tokens = sum(r.result().completion_tokens for r in requests)
        elapsed = time.perf_counter() - started
    finally:
        engine.close()
        llm.close()
    return {"elapsed": elapsed, "tokens": tokens}


async def _clients(url: str, args) -> dict:
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=3600)
    await client.completions.create(model=args.name, prompt=PROMPTS[-1], max_tokens=args.tokens,
                                    extra_body={"ignore_eos": True, "seed": 0})  # warm-up, as the engine's

    async def one(i: int):
        started, first, n = time.perf_counter(), None, 0
        stream = await client.completions.create(model=args.name, prompt=PROMPTS[i], max_tokens=args.tokens,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True, "seed": 0})
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].text and first is None:
                first = time.perf_counter() - started
            if chunk.usage:
                n = chunk.usage.completion_tokens
        return first, n

    started = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(args.clients)))
    elapsed = time.perf_counter() - started
    await client.close()
    return {"elapsed": elapsed, "tokens": sum(n for _, n in results),
            "ttft": statistics.median(f for f, _ in results if f is not None)}


def served_run(args) -> dict:
    from hypura.serve.server import Server
    from hypura.serve.settings import ServeSettings

    settings = ServeSettings(models=(args.model,), port=0, parallel=args.parallel, n_ctx=args.ctx,
                             gpu_mem=args.gpu_mem, ram=args.ram, max_queue=max(64, args.clients),
                             llama_kwargs=_threads(args))
    server = Server(settings, log_level="warning").start()
    try:
        while not server.state.ready:
            if server.state.error:
                raise SystemExit(server.state.error)
            time.sleep(0.1)
        args.name = next(iter(server.state.registry)).name
        return asyncio.run(_clients(server.url, args))
    finally:
        server.stop()


def _threads(args) -> dict:
    return {"n_threads": args.threads, "n_threads_batch": args.threads} if args.threads else {}


def main() -> None:
    from hypura.models import default_model_path

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default=None)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--ctx", type=int, default=512, help="context per sequence")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--gpu-mem", default=None)
    p.add_argument("--ram", default=None)
    args = p.parse_args()
    args.model = args.model or str(default_model_path())
    engine = engine_run(args)
    served = served_run(args)
    print(f"{args.clients} requests x {args.tokens} tokens, parallel {args.parallel}")
    print("| run | requests/s | generated tok/s | time to first token (median) |")
    print("|---|---|---|---|")
    for name, r in (("engine", engine), ("hypura serve + openai clients", served)):
        ttft = f"{r['ttft'] * 1000:.0f} ms" if "ttft" in r else "-"
        print(f"| {name} | {args.clients / r['elapsed']:.2f} | {r['tokens'] / r['elapsed']:.1f} | {ttft} |")
    print(f"served / engine: {(served['tokens'] / served['elapsed']) / (engine['tokens'] / engine['elapsed']):.2f}")


if __name__ == "__main__":
    main()
