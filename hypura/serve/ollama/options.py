"""Ollama's `options` (its Modelfile parameters) as the engine's SamplingParams.

Sampling options are honoured with Ollama's defaults; options that choose how a model is loaded
(num_gpu, num_thread, use_mmap...) are fixed when `hypura serve` starts and are ignored here, as
Ollama ignores them for a model already loaded. `num_ctx` bounds the request's context, at most the
server's context per sequence. Samplers the engine lacks are accepted only at their neutral value.
"""

from __future__ import annotations

from typing import Optional

from hypura.engine import SamplingParams
from hypura.serve.generate.generation import sampling
from hypura.serve.http import fields
from hypura.serve.http.errors import bad_request

# Ollama's defaults (its api/types.go DefaultOptions), where they differ from llama.cpp's
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.0, "repeat_penalty": 1.1, "repeat_last_n": 64}
LOAD_OPTIONS = frozenset({"num_keep", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all",
                          "vocab_only", "use_mmap", "use_mlock", "embedding_only", "num_thread", "numa",
                          "penalize_newline", "mirostat_tau", "mirostat_eta"})  # the last two act only with mirostat
NEUTRAL = {"mirostat": 0, "typical_p": 1.0, "tfs_z": 1.0}
MAX_STOPS = 16  # more stop strings than any client sends; each is checked at every token
SEED_RANGE = 2**32  # llama.cpp's sampler seed is a uint32


def ollama_sampling(options: dict) -> tuple[SamplingParams, Optional[int]]:
    """(params, num_ctx or None) from a request's `options`; a bad value is a 400 naming it."""
    for key, neutral in NEUTRAL.items():
        value = options.get(key)
        if value is not None and value != neutral:
            raise bad_request(f"option '{key}' is not supported (only {neutral}, its neutral value)")
    n_predict = fields.integer(options, "num_predict", -1, lo=-2)
    if n_predict == 0:
        raise bad_request("option 'num_predict' is 0: want >= 1, or -1 for no limit")
    seed = fields.integer(options, "seed", None)
    repeat_penalty = fields.number(options, "repeat_penalty", DEFAULTS["repeat_penalty"], lo=0.0)
    params = sampling(
        max_tokens=-1 if n_predict < 0 else n_predict,  # -2 ("fill the context") is the same here
        temperature=fields.number(options, "temperature", DEFAULTS["temperature"], lo=0.0),
        top_k=fields.integer(options, "top_k", DEFAULTS["top_k"], lo=0),
        top_p=fields.number(options, "top_p", DEFAULTS["top_p"], lo=0.0, hi=1.0),
        min_p=fields.number(options, "min_p", DEFAULTS["min_p"], lo=0.0, hi=1.0),
        repeat_penalty=repeat_penalty or 1.0,  # Ollama reads 0 as "off", which is 1.0 to llama.cpp
        repeat_last_n=fields.integer(options, "repeat_last_n", DEFAULTS["repeat_last_n"], lo=-1),
        presence_penalty=fields.number(options, "presence_penalty", 0.0),
        frequency_penalty=fields.number(options, "frequency_penalty", 0.0),
        seed=None if seed is None or seed < 0 else seed % SEED_RANGE,  # Ollama: -1 is a random seed
        stop=fields.strings(options, "stop", MAX_STOPS),
    )
    return params, fields.integer(options, "num_ctx", None, lo=1)
