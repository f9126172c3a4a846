"""What HTTP costs: aggregate decode through `hypura serve` beside the engine driven directly.

    python3 bench/serve_throughput.py [MODEL] [--clients 16] [--parallel N (default: --clients)] [--tokens 128]
        [--ctx N (default: hypura serve's)] [--threads N] [--gpu-mem 8GiB --ram 64GiB]
        [--spec none|auto [--models-dir DIR]] [--served-only] [--json FILE]

Both runs load the model the same way (hypura.engine.load: `parallel` sequences, the budgets' plan made
for steps of `parallel` tokens) and generate `--tokens` tokens for each of `--clients` requests with
ignore_eos, so that every request is as long as asked. First the engine alone (submit all, wait for
all), then the same requests from as many concurrent `openai` clients (AsyncOpenAI, /v1/completions,
streaming) against the server on 127.0.0.1. Reported for each: aggregate decode tok/s as `hypura bench
--parallel` counts it (the engine's decode-only steps: generated tokens / their time), generated tok/s
end to end (prompts and queue included), requests/s; for the served run the median time to first
token (all clients start at once, so it includes the queue) and served/engine ratios. A table goes to
stderr, the JSON to stdout (and --json FILE). --spec auto: speculation as `hypura serve` does it unless told
(a draft found in the stores and --models-dir, else n-gram drafting, where the plan streams weights; the
engine's speculative counters reported); none (the default here): off.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

import hypura  # noqa: F401  first: our library loads before numpy

PROMPTS = [f"Write a short story about the number {i}." for i in range(1024)]


def engine_run(args) -> dict:
    from hypura.engine import SamplingParams, load

    from hypura.engine import EngineConfig

    llm, engine = load(args.model, args.parallel, args.ctx, config=EngineConfig(speculative=_spec(args)),
                       gpu_mem=args.gpu_mem, ram=args.ram, **_threads(args))
    try:
        params = SamplingParams(max_tokens=args.tokens, ignore_eos=True, seed=0)
        warm = engine.submit(engine.tokenize(PROMPTS[-1]), params)
        warm.result()
        before = engine.metrics()
        started = time.perf_counter()
        requests = [engine.submit(engine.tokenize(PROMPTS[i]), params) for i in range(args.clients)]
        tokens = sum(r.result().completion_tokens for r in requests)
        elapsed = time.perf_counter() - started
        decode = _decode_since(before, engine.metrics())
        plan = llm.plan
    finally:
        engine.close()
        llm.close()
    return {"elapsed_s": elapsed, "tokens": tokens, **decode, **_plan_summary(plan)}


def _spec(args):
    """--spec auto: hypura serve's default speculation (SpecSettings of type auto, searching --models-dir too)."""
    if args.spec == "none":
        return None
    from hypura.speculative.auto_draft import AutoDraft
    from hypura.speculative.settings import SpecSettings

    return SpecSettings(type="auto", draft_model=AutoDraft(args.models_dir))


def _decode_since(before: dict, after: dict) -> dict:
    """The engine's decode-only steps between two metrics() snapshots, as `hypura bench --parallel` times them."""
    tokens = after["decode"]["tokens"] - before["decode"]["tokens"]
    seconds = after["decode"]["seconds"] - before["decode"]["seconds"]
    return {"decode_tok_s": tokens / seconds if seconds else 0.0, "decode_steps": after["decode"]["steps"] -
            before["decode"]["steps"], "failed_steps": after["failed_steps"] - before["failed_steps"],
            "speculative": after.get("speculative")}


def _plan_summary(plan) -> dict:
    if plan is None:
        return {"plan": None}
    return {"plan": {"mode": plan.mode, "config": plan.config, "parallel": plan.prediction.parallel,
                     "predicted_decode_tok_s": plan.prediction.decode_tok_s, "kv_tier": plan.kv_tier,
                     "kv_bytes": plan.kv_bytes, "n_ctx": plan.n_ctx,
                     # one client's step on its own path (plan/solve.py), the figure a lone client compares with
                     "predicted_one_tok_s": plan.one_decode_tok_s}}


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
            # the first token's event, text or not (a piece that ends inside a UTF-8 character is held back)
            if chunk.choices and first is None:
                first = time.perf_counter() - started
            if chunk.usage:
                n = chunk.usage.completion_tokens
        return first, n

    before = args.engine.metrics()
    started = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(args.clients)))
    elapsed = time.perf_counter() - started
    await client.close()
    return {"elapsed_s": elapsed, "tokens": sum(n for _, n in results),
            "ttft_s": statistics.median([f for f, _ in results if f is not None] or [float("nan")]),
            **_decode_since(before, args.engine.metrics())}


def served_run(args) -> dict:
    from hypura.serve.server import Server
    from hypura.serve.settings import ServeSettings

    settings = ServeSettings(models=(args.model,), port=0, parallel=args.parallel, n_ctx=args.ctx,
                             gpu_mem=args.gpu_mem, ram=args.ram, max_queue=max(64, args.clients),
                             speculative=_spec(args), llama_kwargs=_threads(args))
    server = Server(settings, log_level="warning").start()
    try:
        while not server.state.ready:
            if server.state.error:
                raise SystemExit(server.state.error)
            time.sleep(0.1)
        entry = next(iter(server.state.registry))
        args.name, args.engine = entry.name, entry.engine
        return {**asyncio.run(_clients(server.url, args)), **_plan_summary(entry.llm.plan)}
    finally:
        server.stop()


def _threads(args) -> dict:
    return {"n_threads": args.threads, "n_threads_batch": args.threads} if args.threads else {}


def main() -> None:
    from hypura.models import default_model_path

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default=None)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--parallel", type=int, default=None, help="sequences decoded together (default: --clients)")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--ctx", type=int, default=None,
                   help="context per sequence (default: hypura serve's, 4096 held to the training context)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--gpu-mem", default=None)
    p.add_argument("--ram", default=None)
    p.add_argument("--spec", choices=("none", "auto"), default="none", help="auto: hypura serve's default speculation")
    p.add_argument("--models-dir", default=None, help="--spec auto: a folder searched for a draft too")
    p.add_argument("--served-only", action="store_true", help="no engine-alone run")
    p.add_argument("--json", dest="json_out", default=None, help="write the JSON here too")
    args = p.parse_args()
    args.model = args.model or str(default_model_path())
    args.parallel = args.parallel or args.clients
    if args.ctx is None:  # as `hypura serve -np N` sizes it without -c
        from hypura.modelfile import read_header
        from hypura.serve.settings import ServeSettings

        args.ctx = ServeSettings(parallel=args.parallel).ctx_per_seq(read_header(args.model))
    runs = {}
    if not args.served_only:
        runs["engine"] = engine_run(args)
        print(json.dumps({"engine": runs["engine"]}), file=sys.stderr, flush=True)  # kept if the served run fails
    runs["served"] = served_run(args)
    for r in runs.values():
        r.update(generated_tok_s=r["tokens"] / r["elapsed_s"], requests_s=args.clients / r["elapsed_s"])
    result = {"model": args.model, "clients": args.clients, "parallel": args.parallel, "tokens": args.tokens,
              "budgets": {"gpu_mem": args.gpu_mem, "ram": args.ram}, **runs,
              "served_over_engine": {k: runs["served"][k] / runs["engine"][k] if runs["engine"][k] else None
                                     for k in ("decode_tok_s", "generated_tok_s")} if "engine" in runs else {}}
    say = lambda line: print(line, file=sys.stderr)  # noqa: E731
    say(f"{args.clients} requests x {args.tokens} tokens, parallel {args.parallel}")
    say("| run | aggregate decode tok/s | generated tok/s | requests/s | time to first token (median) |")
    say("|---|---|---|---|---|")
    for name, r in (("engine", runs.get("engine")), ("hypura serve + openai clients", runs["served"])):
        if r is None:
            continue
        ttft = f"{r['ttft_s'] * 1000:.0f} ms" if "ttft_s" in r else "-"
        say(f"| {name} | {r['decode_tok_s']:.1f} | {r['generated_tok_s']:.1f} | {r['requests_s']:.2f} | {ttft} |")
    spec = runs["served"].get("speculative")
    if spec:
        say(f"speculative: {spec['type']}{' ' + spec['draft'] if spec.get('draft') else ''}: {spec['passes']} passes, "
            f"{spec['tokens_per_pass']:.2f} tokens a pass, {spec['steps']} steps drafted, {spec['aside_steps']} set aside")
    say("served / engine: " + ", ".join(f"{k} {v:.2f}" for k, v in result["served_over_engine"].items() if v))
    text = json.dumps(result, indent=1)
    print(text)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
