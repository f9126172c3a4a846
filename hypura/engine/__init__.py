"""The batched engine: many requests share every llama_decode, so a streamed weight byte serves them all.

    engine = Engine(llm, EngineConfig(parallel=4))      # llm: a hypura.loaded.LoadedModel loaded with parallel >= 4
    engine = Engine(llm, config, load_draft(llm, config))   # config.speculative of type draft-simple: its draft model
    engine.start()                                      # its loop runs on a thread of its own
    req = engine.submit(tokens, SamplingParams(...), on_event=None)   # QueueFull, PromptTooLong
    for event in req.events(): ...                      # Event(text, token, finish_reason, error)
    req.cancel()                                        # frees its sequence and KV at once
    req.result(timeout=None) -> Result
    engine.tokenize(text, add_special=True, parse_special=True) / engine.detokenize(tokens)
    engine.metrics() -> dict                            # requests, tokens, queue, active sequences, ...
    engine.close()

    llm, engine = load(model_path, parallel=4, n_ctx_per_seq=4096, **hypura_llama_kwargs)   # both made, started

    types.py          what it takes and gives: SamplingParams, Event, Result, and the errors of submit()
    config.py         EngineConfig, read once when an Engine is made
    loader.py         load(): the model loaded for `parallel` sequences (hypura.loaded.load), its draft model when
                      it speculates with one (load_draft), an Engine on them
    sizes.py          what the loaded context gives the engine: the tokens a sequence holds, a step's tokens
    engine.py         Engine: the public API; the loop of the thread owning the context: schedule, run, postprocess
    inbox.py          what other threads hand the engine (requests, cancellations, closing) and read back: one lock
    request.py        the handle submit() returns: events, result, cancel, from any thread
  schedule
    scheduler.py      Scheduler: cancelled sequences ended, waiting requests admitted, drafts, the step; finish()
    prefix_cache.py   slots and the tokens each one's KV holds; a new prompt's slot and reusable prefix
    cells.py          the KV cells each slot holds (a shared prefix's counted once)
    admission.py      a sequence put in its slot; kv_unified: admission by cells, waiting, preemption by recompute
    sequence.py       a request in a slot: prompt progress, generated tokens, sampler, the rules that end it
    speculate.py      every decoding sequence's draft, verified in the same step
    step.py           what one step carries under a token budget: decode tokens first, then prompt chunks
  run
    runner.py         Runner: the step written into the llama_batch, one llama_decode, the greedy tokens read
    batch.py          a step written into the llama_batch; the greedy sequences' tokens read from its logits
  postprocess
    postprocess.py    Postprocessor: samples taken, drafts verified, tokens handed to their sequences, counters
    sampler.py        a request's llama.cpp sampler chain (hypura-cli's too)
    text.py           generated tokens as text, released once final (split UTF-8, stop strings)
    outbox.py         a step's events and results, delivered together right before the next llama_decode
    metrics.py        counters since made: requests, tokens, steps timed as llama-batched-bench times them
  between steps
    embed.py          embeddings from the engine's own context
See docs/engine.md.
"""

from hypura.engine.types import FINISH_REASONS, EngineClosed, Event, PromptTooLong, QueueFull, Result, SamplingParams
from hypura.engine.config import EngineConfig

__all__ = ["FINISH_REASONS", "Engine", "EngineClosed", "EngineConfig", "Event", "PromptTooLong", "QueueFull", "Result",
           "SamplingParams", "engine_llama_kwargs", "load", "load_draft"]


def __getattr__(name: str):
    # imported lazily: the types above need no llama.cpp library
    if name == "Engine":
        from hypura.engine.engine import Engine

        return Engine
    if name in ("load", "load_draft", "engine_llama_kwargs"):
        from hypura.engine import loader

        return getattr(loader, name)
    raise AttributeError(f"module 'hypura.engine' has no attribute {name!r}")
