"""What the engine's tests share: SmolLM2-135M loaded for PARALLEL sequences of N_CTX tokens (each module's
`llm` fixture), an engine running on it, and the prompts."""

import contextlib

import llama_cpp

import hypura
from hypura.engine import Engine, EngineConfig, SamplingParams, engine_llama_kwargs

PARALLEL, N_CTX = 4, 256
GREEDY = SamplingParams(max_tokens=16, temperature=0.0)
PROMPT = "The capital of France is"
SYSTEM = ("You are a careful assistant. You answer in one short sentence, you never guess, and you say so "
          "when you do not know. ") * 2
LONG = SYSTEM * 8  # more tokens than a sequence holds


def engine_llm(smollm2_path, n_threads):
    """A module fixture's body: `yield from engine_llm(...)`."""
    llm = hypura.Llama(str(smollm2_path), n_threads=n_threads, n_threads_batch=n_threads,
                       **engine_llama_kwargs(PARALLEL, N_CTX))
    yield llm
    llm.close()


@contextlib.contextmanager
def running(llm, **config):
    engine = Engine(llm.loaded, EngineConfig(**config)).start()
    try:
        yield engine
    finally:
        engine.close()


def kv_positions(engine, slot):
    mem = llama_cpp.llama_get_memory(engine.llm.ctx)
    return llama_cpp.llama_memory_seq_pos_min(mem, slot), llama_cpp.llama_memory_seq_pos_max(mem, slot)

