"""Ollama's API (its docs/api.md): /, /api/version, /api/tags, /api/ps, /api/show, /api/generate, /api/chat.

Generation streams NDJSON by default (`"stream": false` for one JSON object); the last object has
`done_reason` and the nanosecond metrics. `options` are honoured as Ollama reads them (ollama_options);
`tools` (calls in `message.tool_calls`), `format` ("json" or a schema, through a grammar), `think`
(`thinking` apart from the reply), `logprobs` and `suffix` (models with fill-in-the-middle tokens) too.
What this server cannot do (images, Go template overrides) is a 400 that says so, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import json
import time
from datetime import datetime, timezone

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

import hypura
from hypura.chat_template import METADATA_KEY
from hypura.engine.types import MAX_TOP_LOGPROBS
from hypura.modelfile import read_header
from hypura.serve.generate.generation import Job, checked_token_ids, fim_tokens, make_job, submit, text_tokens
from hypura.serve.generate.grammars import ollama_format_grammar
from hypura.serve.http import fields
from hypura.serve.http.errors import bad_request
from hypura.serve.http.streaming import NDJSON, StreamResponse, ndjson
from hypura.serve.ollama.options import ollama_sampling
from hypura.serve.openai.shapes import chat_logprobs
from hypura.serve.tools import read_tools
from hypura.serve.tools.chat import ChatSpec, prepare, thinks, thinks_in, tools_served
from hypura.serve.tools.replies import whole_replies
from hypura.serve.tools.stream import Delta, ReplyStream

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
    n_ctx = entry.n_ctx if entry else registry.settings.ctx_per_seq(read_header(offer.path))
    parameters = _parameters(offer.params, n_ctx)
    modelfile = "".join(f"PARAMETER {line}\n" for line in parameters.splitlines())
    return JSONResponse({
        "modelfile": f"# served by hypura\nFROM {offer.path}\n{modelfile}",
        "parameters": parameters, "template": offer.info.metadata.get(METADATA_KEY, ""),
        "details": offer.info.details(), "model_info": offer.info.model_info(),
        "capabilities": _capabilities(offer, entry), "modified_at": offer.modified_at.isoformat(),
    })


def _capabilities(offer, entry) -> list[str]:
    """A loaded model's as its template and vocabulary are; one not loaded is judged from its GGUF's metadata
    (a template that fails to load later serves neither tools nor thinking)."""
    if entry is not None:
        tools, think, insert = tools_served(entry), thinks(entry), entry.engine.fim_tokens() is not None
    else:
        source = offer.info.metadata.get(METADATA_KEY, "")
        tools, think = bool(source), thinks_in(source)
        insert = all(f"tokenizer.ggml.fim_{k}_token_id" in offer.info.metadata for k in ("pre", "suf", "mid"))
    return ["completion", *(["tools"] if tools else []), *(["thinking"] if think else []),
            *(["insert"] if insert else [])]


def _refuse_unsupported(body: dict) -> None:
    if body.get("images") or any(isinstance(m, dict) and m.get("images") for m in body.get("messages") or []):
        raise bad_request("images are not supported: the models served are text-only")


def _think(body: dict):
    """Ollama's `think`: true/false, or a level ("low", "medium", "high") that means on."""
    think = body.get("think")
    if think is None or isinstance(think, bool):
        return think
    if think in ("low", "medium", "high"):
        return True
    if think == "none":
        return False
    raise bad_request("'think' must be true, false, or one of low, medium, high")


def _logprobs(body: dict):
    top = fields.integer(body, "top_logprobs", 0, lo=0, hi=MAX_TOP_LOGPROBS)
    return top if fields.boolean(body, "logprobs", False) else None


def _with(params, grammar, logprobs):
    return dataclasses.replace(params, grammar=grammar, logprobs=logprobs) if grammar or logprobs is not None \
        else params


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


def _metrics(result, started: float) -> dict:
    r = result
    return {"done_reason": r.finish_reason, "total_duration": int((time.monotonic() - started) * NS),
            "load_duration": 0,  # a load on demand happens before the request starts (the gate)
            "prompt_eval_count": r.prompt_tokens, "prompt_eval_duration": int(r.prompt_s * NS),
            "eval_count": r.completion_tokens, "eval_duration": int(r.decode_s * NS),
            # beyond Ollama's fields: the prompt tokens reused from the KV cache (a conversation's earlier turns)
            "hypura": {"cached_tokens": r.cached_tokens}}


def load_answer(model: str, chat: bool, reason: str = "load") -> JSONResponse:
    """An empty prompt or conversation loads the model in Ollama (the gate loaded it), or with keep_alive 0
    unloads it."""
    out = {"model": model, "created_at": _now(), "done": True, "done_reason": reason}
    out.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
    return JSONResponse(out)


async def generate(request: Request):
    started = time.monotonic()
    body = await fields.json_body(request)
    entry = request.app.state.registry.get(fields.string(body, "model"), request.scope)
    _refuse_unsupported(body)
    if fields.string(body, "template"):
        raise bad_request("'template' overrides are not supported: the model's own chat template applies")
    prompt = fields.string(body, "prompt", default="")
    suffix = fields.string(body, "suffix")
    raw = fields.boolean(body, "raw", False)
    stream = fields.boolean(body, "stream", True)
    context = checked_token_ids(entry, body.get("context") or [], "context")
    params, n_ctx = ollama_sampling(entry.options(fields.mapping(body, "options")))
    grammar = ollama_format_grammar(body.get("format"))
    if not prompt and not context:
        return load_answer(entry.name, chat=False)
    parser = lambda: ReplyStream(think=False)  # noqa: E731
    if suffix:
        tokens = await fim_tokens(entry, prompt, suffix)
    elif raw:
        tokens = await text_tokens(entry, prompt) if prompt else []
    else:
        system = fields.string(body, "system")
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        prepared = await prepare(entry, messages, ChatSpec(think=_think(body), grammar=grammar))
        tokens, parser = prepared.tokens, prepared.reply
    job = make_job(entry, context + tokens, _with(params, grammar, _logprobs(body)), n_ctx)
    head = {"model": entry.name}

    def final(result) -> dict:
        out = {**head, "created_at": _now(), "response": "", "done": True, **_metrics(result, started)}
        if not raw:  # Ollama returns no context in raw mode
            out["context"] = job.tokens + list(result.tokens)
        return out

    def shape(delta, calls):
        return {"response": delta.content, **({"thinking": delta.thinking} if delta.thinking else {})}

    return await _respond(request, job, stream, head, final, parser, shape)


async def chat(request: Request):
    started = time.monotonic()
    body = await fields.json_body(request)
    entry = request.app.state.registry.get(fields.string(body, "model"), request.scope)
    _refuse_unsupported(body)
    messages = _messages(body)
    stream = fields.boolean(body, "stream", True)
    params, n_ctx = ollama_sampling(entry.options(fields.mapping(body, "options")))
    tools = read_tools(body.get("tools"))
    spec = ChatSpec(tools, "auto" if tools else "none", True, _think(body), ollama_format_grammar(body.get("format")))
    if not messages:
        return load_answer(entry.name, chat=True)
    prepared = await prepare(entry, messages, spec)
    job = make_job(entry, prepared.tokens, _with(params, prepared.grammar, _logprobs(body)), n_ctx)
    head = {"model": entry.name}

    def final(result) -> dict:
        return {**head, "created_at": _now(), "message": {"role": "assistant", "content": ""}, "done": True,
                **_metrics(result, started)}

    def shape(delta, calls):
        message = {"role": "assistant", "content": delta.content}
        if delta.thinking:
            message["thinking"] = delta.thinking
        if calls:
            message["tool_calls"] = [{"id": c.id, "function": {"index": i, "name": c.name, "arguments": c.arguments}}
                                     for i, c in enumerate(calls)]
        return {"message": message}

    return await _respond(request, job, stream, head, final, prepared.reply, shape)


def _logprob_list(engine, items) -> dict:
    return {"logprobs": chat_logprobs(engine, items)["content"]} if items else {}


async def _respond(request: Request, job: Job, stream: bool, head: dict, final, parser, shape):
    """One JSON object (the reply in the final one) or an NDJSON stream of pieces, then the final.
    `shape(delta, calls)`: a piece's fields (`message` or `response`)."""
    engine = job.entry.engine
    if not stream:
        reply = (await whole_replies(request.receive, job, parser))[0]
        out = final(reply.result)
        out.update(shape(Delta(reply.thinking, reply.content), reply.calls))
        out.update(_logprob_list(engine, reply.logprobs))
        return JSONResponse(out)
    engine_stream = submit(job)  # before the 200: a full queue is still a 429
    split = parser()

    async def chunks():
        async for event in engine_stream.events():
            if event.finish_reason == "error":
                yield ndjson({"error": f"generation failed: {event.error}"})
                return
            delta = split.push(event.text)
            if delta.thinking or delta.content or event.logprob:
                logprobs = _logprob_list(engine, [(event.token, event.logprob)] if event.logprob else [])
                yield ndjson({**head, "created_at": _now(), **shape(delta, []), **logprobs, "done": False})
        delta, calls = split.finish()
        if delta.thinking or delta.content or calls:
            yield ndjson({**head, "created_at": _now(), **shape(delta, calls), "done": False})
        yield ndjson(final(engine_stream.result()))

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
