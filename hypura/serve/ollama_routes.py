"""Ollama's API (its docs/api.md): /, /api/version, /api/tags, /api/ps, /api/show, /api/generate, /api/chat.

Generation streams NDJSON by default (`"stream": false` for one JSON object); the last object has
`done_reason` and the nanosecond metrics. `options` are honoured as Ollama reads them (ollama_options);
what this server cannot do (images, tools, thinking, JSON formats, Go template overrides, suffix) is a
400 that says so, never silently ignored.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

import hypura
from hypura.serve import fields
from hypura.serve.errors import ApiError, bad_request
from hypura.serve.generation import Finished, Job, chat_tokens, checked_token_ids, make_job, run_to_end, submit, \
    text_tokens
from hypura.serve.ollama_options import ollama_sampling
from hypura.serve.streaming import NDJSON, StreamResponse, ndjson, race_disconnect

NS = 1_000_000_000


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


async def root(request: Request):
    return PlainTextResponse("Hypura is running (Ollama API)")


async def version(request: Request):
    return JSONResponse({"version": hypura.__version__})


def _listing(info, modified_at: datetime) -> dict:
    return {"name": info.name, "model": info.name, "modified_at": modified_at.isoformat(), "size": info.size,
            "digest": info.digest, "details": info.details()}


async def tags(request: Request):
    """Every model on offer, loaded or not (Ollama's digests for models from its store)."""
    return JSONResponse({"models": [_listing(o.info, o.modified_at) for o in request.app.state.registry.offers()]})


async def ps(request: Request):
    """The models loaded now, when each is unloaded if idle, and what Hypura's planner chose for it."""
    models = []
    for e in request.app.state.registry:
        models.append({**_listing(e.info, e.loaded_at), "expires_at": e.expires_at().isoformat(),
                       "size_vram": e.size_vram, "context_length": e.n_ctx,
                       "hypura": {"plan": e.plan, "loaded_at_start": e.pinned, "load_s": round(e.load_s, 3)}})
    return JSONResponse({"models": models})


def _parameters(params: dict, n_ctx: int) -> str:
    """Ollama's `parameters` text: one `key value` line per parameter (each stop string on its own)."""
    lines = [f"{k} {json.dumps(x) if isinstance(x, str) else x}" for k, v in params.items()
             for x in (v if isinstance(v, list) else [v])]
    return "\n".join(lines if "num_ctx" in params else [*lines, f"num_ctx {n_ctx}"])


async def show(request: Request):
    """What a model is, without loading it (as Ollama's /api/show)."""
    body = await fields.json_body(request)
    registry = request.app.state.registry
    offer = registry.find(fields.string(body, "model") or fields.string(body, "name"))
    entry = registry.entries.get(offer.name)
    n_ctx = entry.n_ctx if entry else registry.settings.n_ctx
    parameters = _parameters(offer.params, n_ctx)
    modelfile = "".join(f"PARAMETER {line}\n" for line in parameters.splitlines())
    return JSONResponse({
        "modelfile": f"# served by hypura\nFROM {offer.path}\n{modelfile}",
        "parameters": parameters, "template": offer.info.metadata.get("tokenizer.chat_template", ""),
        "details": offer.info.details(), "model_info": offer.info.model_info(), "capabilities": ["completion"],
        "modified_at": offer.modified_at.isoformat(),
    })


def _refuse_unsupported(body: dict) -> None:
    if body.get("images") or any(isinstance(m, dict) and m.get("images") for m in body.get("messages") or []):
        raise bad_request("images are not supported: the models served are text-only")
    if body.get("tools"):
        raise bad_request(f"{body.get('model')} does not support tools")
    think = body.get("think")
    if think not in (None, False, "none"):
        raise bad_request(f"{body.get('model')} does not support thinking")
    if body.get("format") not in (None, ""):
        raise bad_request("'format' (JSON mode, structured outputs) is not supported")
    if body.get("logprobs"):
        raise bad_request("'logprobs' is not supported")


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages") or []
    if not isinstance(messages, list):
        raise bad_request("'messages' must be a list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{i}] must be an object")
        role = fields.string(m, "role", required=True)
        content = fields.string(m, "content", default="")
        message = {"role": role, "content": content}
        for key in ("tool_calls", "tool_name", "thinking"):
            if m.get(key) is not None:
                message[key] = m[key]
        out.append(message)
    return out


def _metrics(finished: Finished, started: float) -> dict:
    r = finished.result
    return {"done_reason": r.finish_reason, "total_duration": int((time.monotonic() - started) * NS),
            "load_duration": 0,  # a load on demand happens before the request starts (the gate)
            "prompt_eval_count": r.prompt_tokens, "prompt_eval_duration": int(r.prompt_s * NS),
            "eval_count": r.completion_tokens, "eval_duration": int(r.decode_s * NS)}


def load_answer(model: str, chat: bool, reason: str = "load") -> JSONResponse:
    """An empty prompt or conversation loads the model in Ollama (the gate loaded it), or with keep_alive 0
    unloads it."""
    out = {"model": model, "created_at": _now(), "done": True, "done_reason": reason}
    out.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
    return JSONResponse(out)


async def generate(request: Request):
    started = time.monotonic()
    body = await fields.json_body(request)
    entry = request.app.state.registry.get(fields.string(body, "model"))
    _refuse_unsupported(body)
    if fields.string(body, "suffix"):
        raise bad_request("'suffix' (fill in the middle) is not supported")
    if fields.string(body, "template"):
        raise bad_request("'template' overrides are not supported: the model's own chat template applies")
    prompt = fields.string(body, "prompt", default="")
    raw = fields.boolean(body, "raw", False)
    stream = fields.boolean(body, "stream", True)
    context = checked_token_ids(entry, body.get("context") or [], "context")
    params, n_ctx = ollama_sampling(entry.options(fields.mapping(body, "options")))
    if not prompt and not context:
        return load_answer(entry.name, chat=False)
    if raw:
        tokens = await text_tokens(entry, prompt) if prompt else []
    else:
        system = fields.string(body, "system")
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        tokens = await chat_tokens(entry, messages)
    job = make_job(entry, context + tokens, params, n_ctx)
    head = {"model": entry.name}

    def final(finished: Finished) -> dict:
        out = {**head, "created_at": _now(), "response": "", "done": True, **_metrics(finished, started)}
        if not raw:  # Ollama returns no context in raw mode
            out["context"] = job.tokens + list(finished.result.tokens)
        return out

    return await _respond(request, job, stream, head, final, lambda text: {"response": text})


async def chat(request: Request):
    started = time.monotonic()
    body = await fields.json_body(request)
    entry = request.app.state.registry.get(fields.string(body, "model"))
    _refuse_unsupported(body)
    messages = _messages(body)
    stream = fields.boolean(body, "stream", True)
    params, n_ctx = ollama_sampling(entry.options(fields.mapping(body, "options")))
    if not messages:
        return load_answer(entry.name, chat=True)
    job = make_job(entry, await chat_tokens(entry, messages), params, n_ctx)
    head = {"model": entry.name}

    def final(finished: Finished) -> dict:
        return {**head, "created_at": _now(), "message": {"role": "assistant", "content": ""}, "done": True,
                **_metrics(finished, started)}

    return await _respond(request, job, stream, head, final,
                          lambda text: {"message": {"role": "assistant", "content": text}})


async def _respond(request: Request, job: Job, stream: bool, head: dict, final, piece):
    """One JSON object (the pieces joined into the final one) or an NDJSON stream of pieces, then the final."""
    if not stream:
        finished = await race_disconnect(request.receive, run_to_end(job))
        if finished.result.finish_reason == "error":
            raise ApiError(500, f"generation failed: {finished.error}")
        out = final(finished)
        out.update(piece(finished.result.text))
        return JSONResponse(out)
    engine_stream = submit(job)  # before the 200: a full queue is still a 429

    async def chunks():
        async for event in engine_stream.events():
            if event.finish_reason == "error":
                yield ndjson({"error": f"generation failed: {event.error}"})
                return
            if event.text:
                yield ndjson({**head, "created_at": _now(), **piece(event.text), "done": False})
        result = engine_stream.result()
        yield ndjson(final(Finished("", result, None)))

    return StreamResponse(chunks(), NDJSON, engine_stream.cancel)


ROUTES = [
    Route("/", root, methods=["GET"]),
    Route("/api/version", version, methods=["GET"]),
    Route("/api/tags", tags, methods=["GET"]),
    Route("/api/ps", ps, methods=["GET"]),
    Route("/api/show", show, methods=["POST"]),
    Route("/api/generate", generate, methods=["POST"]),
    Route("/api/chat", chat, methods=["POST"]),
]
