"""The batched engine: many requests share every llama_decode, so a streamed weight byte serves them all.

    engine = Engine(llm, EngineConfig(parallel=4))      # llm: a hypura.loaded.LoadedModel loaded with parallel >= 4
    engine.start()                                      # its loop runs on a thread of its own
    req = engine.submit(tokens, SamplingParams(...), on_event=None)   # QueueFull, PromptTooLong
    for event in req.events(): ...                      # Event(text, token, finish_reason, error)
    req.cancel()                                        # frees its sequence and KV at once
    req.result(timeout=None) -> Result
    engine.tokenize(text, add_special=True, parse_special=True) / engine.detokenize(tokens)
    engine.metrics() -> dict                            # requests, tokens, queue, active sequences, ...
    engine.close()

    llm, engine = load(model_path, parallel=4, n_ctx_per_seq=4096, **hypura_llama_kwargs)   # both made, started
See docs/engine.md.
"""

from hypura.engine.types import FINISH_REASONS, EngineClosed, Event, PromptTooLong, QueueFull, Result, SamplingParams
from hypura.engine.config import EngineConfig

__all__ = ["FINISH_REASONS", "Engine", "EngineClosed", "EngineConfig", "Event", "PromptTooLong", "QueueFull", "Result",
           "SamplingParams", "engine_llama_kwargs", "load"]


def __getattr__(name: str):
    # imported lazily: the types above need no llama.cpp library
    if name == "Engine":
        from hypura.engine.engine import Engine

        return Engine
    if name in ("load", "engine_llama_kwargs"):
        from hypura.engine import loader

        return getattr(loader, name)
    raise AttributeError(f"module 'hypura.engine' has no attribute {name!r}")
