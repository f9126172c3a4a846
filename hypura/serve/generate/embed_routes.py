"""Embeddings from the served model: Ollama's /api/embed (a batch, `truncate`) and /api/embeddings (one
prompt, the older route), and OpenAI's /v1/embeddings (strings or token ids; `encoding_format` float or
base64). Vectors are the engine's (engine/embed.py), L2-normalised as Ollama's /api/embed and OpenAI's
are; /api/embeddings gives them as computed, as Ollama's does.
"""

from __future__ import annotations

import asyncio
import base64
import time

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from hypura.engine import EngineClosed
from hypura.errors import HypuraError
from hypura.serve.generate.generation import PROMPT_DEADLINE_S, checked_token_ids
from hypura.serve.http import fields, lifecycle
from hypura.serve.http.errors import ApiError, bad_request
from hypura.serve.models import prompt_tokens

NS = 1_000_000_000
MAX_INPUTS = 2048  # OpenAI's limit on inputs per request


def _texts(value, field: str) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise bad_request(f"'{field}' must be a string or a non-empty list of strings")
    if len(texts) > MAX_INPUTS:
        raise bad_request(f"'{field}' has {len(texts)} inputs (at most {MAX_INPUTS})")
    return texts


async def _tokens(entry, texts: list[str]) -> list[list[int]]:
    """Each text tokenized on a thread of its own, stopped between texts when the request goes (deadline,
    client, shutdown) as a prompt's tokenizing is (generation.py)."""

    def run(cancelled) -> list[list[int]]:
        out = []
        for text in texts:
            if cancelled.is_set():
                raise prompt_tokens.Cancelled()
            out.append(entry.engine.tokenize(text, True, False))
        return out

    return await lifecycle.off_loop(run, PROMPT_DEADLINE_S)


def _fit(entry, inputs: list[list[int]], truncate: bool) -> list[list[int]]:
    limit = min(entry.n_ctx, entry.engine.step_tokens)  # a pooling model's input must fit one batch
    out = []
    for i, tokens in enumerate(inputs):
        if not tokens:
            raise bad_request(f"input {i} is empty")
        if len(tokens) > limit and not truncate:
            raise bad_request(f"input {i} is {len(tokens)} tokens, more than the {limit} an embedding takes here "
                              "(truncate it, or send \"truncate\": true)")
        out.append(tokens[:limit])
    return out


async def _vectors(entry, inputs: list[list[int]], normalise: bool) -> list[np.ndarray]:
    try:
        vectors = await asyncio.to_thread(entry.engine.embed, inputs)
    except EngineClosed:
        raise ApiError(503, "the server is shutting down") from None
    except HypuraError as e:
        raise ApiError(503, f"embedding failed: {e}") from None
    if normalise:
        vectors = [v / (np.linalg.norm(v) or 1.0) for v in vectors]
    return vectors


async def ollama_embed(request: Request):
    started = time.monotonic()
    body = await fields.json_body(request)
    entry = request.app.state.registry.get(fields.string(body, "model"), request.scope)
    inputs = _fit(entry, await _tokens(entry, _texts(body.get("input"), "input")),
                  fields.boolean(body, "truncate", True))
    vectors = await _vectors(entry, inputs, normalise=True)
    return JSONResponse({"model": entry.name, "embeddings": [v.astype(np.float32).tolist() for v in vectors],
                         "total_duration": int((time.monotonic() - started) * NS), "load_duration": 0,
                         "prompt_eval_count": sum(len(t) for t in inputs)})


async def ollama_embeddings(request: Request):
    body = await fields.json_body(request)
    entry = request.app.state.registry.get(fields.string(body, "model"), request.scope)
    prompt = fields.string(body, "prompt", required=True)
    inputs = _fit(entry, await _tokens(entry, [prompt]), truncate=True)
    return JSONResponse({"embedding": (await _vectors(entry, inputs, normalise=False))[0].astype(np.float32).tolist()})


async def openai_embeddings(request: Request):
    body = await fields.json_body(request)
    entry = request.app.state.registry.get(fields.string(body, "model"), request.scope)
    encoding = fields.string(body, "encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise bad_request("'encoding_format' must be float or base64")
    if body.get("dimensions") is not None:
        raise bad_request("'dimensions' is not supported: the model's embeddings have their own size")
    value = body.get("input")
    if isinstance(value, list) and value and all(isinstance(t, int) for t in value):
        inputs = [checked_token_ids(entry, value, "input")]
    elif isinstance(value, list) and value and all(isinstance(t, list) for t in value):
        inputs = [checked_token_ids(entry, t, "input") for t in value]
    else:
        inputs = await _tokens(entry, _texts(value, "input"))
    inputs = _fit(entry, inputs, truncate=False)
    vectors = await _vectors(entry, inputs, normalise=True)

    def encode(v: np.ndarray):
        v = v.astype(np.float32)
        return base64.b64encode(v.tobytes()).decode() if encoding == "base64" else v.tolist()

    n = sum(len(t) for t in inputs)
    return JSONResponse({"object": "list", "model": entry.name, "usage": {"prompt_tokens": n, "total_tokens": n},
                         "data": [{"object": "embedding", "index": i, "embedding": encode(v)}
                                  for i, v in enumerate(vectors)]})


ROUTES = [
    Route("/api/embed", ollama_embed, methods=["POST"]),
    Route("/api/embeddings", ollama_embeddings, methods=["POST"]),
    Route("/v1/embeddings", openai_embeddings, methods=["POST"]),
]
