"""OpenAI's API: /v1/models, /v1/chat/completions, /v1/completions, with the same model names as Ollama's.

Streams are server-sent events ending with `data: [DONE]`; `stream_options.include_usage` adds the
usage chunk before it. Sampling defaults are llama.cpp's (as llama-cpp-python's and llama.cpp's
servers use), and llama.cpp's extra fields `top_k`, `min_p`, `repeat_penalty` and `ignore_eos` are
honoured too.
Chats take tools (`tool_choice`, `parallel_tool_calls`; calls come back as `tool_calls`, streamed in
pieces), `response_format` (JSON mode, JSON schemas) or llama.cpp's `grammar`, `logprobs`, `n` (without
streaming) and `chat_template_kwargs.enable_thinking`; a thinking model's reasoning is `reasoning_content`.
What the server cannot do (logit_bias, images, the deprecated `functions`) is a 400 that says so.
"""

from __future__ import annotations

import time
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import hypura
from hypura.engine.types import MAX_TOP_LOGPROBS
from hypura.serve.generate.generation import Job, checked_token_ids, fim_tokens, make_job, sampling, submit, text_tokens
from hypura.serve.generate.grammars import response_format_grammar
from hypura.serve.http import fields
from hypura.serve.http.errors import bad_request
from hypura.serve.http.streaming import SSE, StreamResponse, sse
from hypura.serve.openai import shapes
from hypura.serve.tools import read_choice, read_tools
from hypura.serve.tools.chat import ChatSpec, prepare
from hypura.serve.tools.replies import whole_replies
from hypura.serve.tools.stream import ReplyStream

MAX_STOPS = 4  # OpenAI's limit
FINGERPRINT = f"hypura-{hypura.__version__}"


def _model_card(offer) -> dict:
    return {"id": offer.name, "object": "model", "created": int(offer.modified_at.timestamp()), "owned_by": "hypura"}


async def models(request: Request):
    return JSONResponse({"object": "list", "data": [_model_card(o) for o in request.app.state.registry.offers()]})


async def model(request: Request):
    return JSONResponse(_model_card(request.app.state.registry.find(request.path_params["model"])))


MAX_N = 8  # choices per request: each is a sequence of the engine's batch


def _refuse_unsupported(body: dict) -> None:
    if body.get("logit_bias"):
        raise bad_request("'logit_bias' is not supported")
    if body.get("functions") or body.get("function_call"):
        raise bad_request("'functions' (deprecated by OpenAI) is not supported: send 'tools'")


def _grammar(body: dict):
    """The response format's grammar, or llama.cpp's `grammar` field (GBNF) as its server takes it."""
    grammar = fields.string(body, "grammar")
    response_format = response_format_grammar(body.get("response_format"))
    if grammar and response_format:
        raise bad_request("give 'grammar' or 'response_format', not both")
    return grammar or response_format


def _params(body: dict, grammar=None, logprobs=None):
    max_tokens = fields.integer(body, "max_completion_tokens", None, lo=1) or \
        fields.integer(body, "max_tokens", None, lo=1)
    return sampling(
        max_tokens=max_tokens or -1,  # OpenAI's default: until the context is full
        temperature=fields.number(body, "temperature", None, lo=0.0, hi=2.0),
        top_p=fields.number(body, "top_p", None, lo=0.0, hi=1.0),
        top_k=fields.integer(body, "top_k", None, lo=0),
        min_p=fields.number(body, "min_p", None, lo=0.0, hi=1.0),
        repeat_penalty=fields.number(body, "repeat_penalty", None, lo=0.0),
        presence_penalty=fields.number(body, "presence_penalty", None, lo=-2.0, hi=2.0),
        frequency_penalty=fields.number(body, "frequency_penalty", None, lo=-2.0, hi=2.0),
        seed=fields.integer(body, "seed", None, lo=0, hi=2**32 - 1),
        stop=fields.strings(body, "stop", MAX_STOPS),
        ignore_eos=fields.boolean(body, "ignore_eos", False),  # llama.cpp's server's: fixed-length benchmarks
        grammar=grammar, logprobs=logprobs,
    )


def _n(body: dict, stream: bool) -> int:
    n = fields.integer(body, "n", 1, lo=1, hi=MAX_N)
    if n > 1 and stream:
        raise bad_request("'n' > 1 is served without streaming only: send \"stream\": false")
    return n


def _content(message: dict, i: int) -> str:
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise bad_request(f"messages[{i}].content must be a string or a list of parts")
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise bad_request(f"messages[{i}].content: only text parts are supported (the models are text-only)")
        texts.append(part["text"])
    return "".join(texts)


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{i}] must be an object")
        role = fields.string(m, "role", required=True)
        message = {"role": "system" if role == "developer" else role, "content": _content(m, i)}
        for key in ("name", "tool_calls", "tool_call_id"):
            if m.get(key) is not None:
                message[key] = m[key]
        out.append(message)
    return out


def _usage(results) -> dict:
    """Usage of one or more choices of one prompt (it is counted once, as OpenAI counts it)."""
    prompt, completion = results[0].prompt_tokens, sum(r.completion_tokens for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": results[0].cached_tokens}}


def _stream_options(body: dict) -> bool:
    return fields.boolean(fields.mapping(body, "stream_options"), "include_usage", False)


def _think(body: dict):
    """llama.cpp's chat_template_kwargs.enable_thinking (None: the template's default)."""
    value = fields.mapping(body, "chat_template_kwargs").get("enable_thinking")
    if value is not None and not isinstance(value, bool):
        raise bad_request("'chat_template_kwargs.enable_thinking' must be true or false")
    return value


async def chat_completions(request: Request):
    body = await fields.json_body(request)
    entry = request.app.state.registry.get(fields.string(body, "model"), request.scope)
    _refuse_unsupported(body)
    messages = _messages(body)
    stream, include_usage = fields.boolean(body, "stream", False), _stream_options(body)
    n = _n(body, stream)
    tools = read_tools(body.get("tools"))
    spec = ChatSpec(tools, read_choice(body.get("tool_choice"), tools),
                    fields.boolean(body, "parallel_tool_calls", True), _think(body), _grammar(body))
    prepared = await prepare(entry, messages, spec)
    top = fields.integer(body, "top_logprobs", 0, lo=0, hi=MAX_TOP_LOGPROBS)
    want_logprobs = fields.boolean(body, "logprobs", False)
    job = make_job(entry, prepared.tokens, _params(body, prepared.grammar, top if want_logprobs else None))
    head = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": entry.name,
            "system_fingerprint": FINGERPRINT}
    engine = entry.engine
    if not stream:
        replies = await whole_replies(request.receive, job, prepared.reply, n)
        return JSONResponse({**head, "object": "chat.completion", "choices": [{
            "index": i, "message": shapes.message(r),
            "logprobs": shapes.chat_logprobs(engine, r.logprobs) if want_logprobs else None,
            "finish_reason": shapes.finish_reason(r.result.finish_reason, r.calls)} for i, r in enumerate(replies)],
            "usage": _usage([r.result for r in replies])})
    parser = prepared.reply()

    def on_event(event):
        delta = parser.push(event.text)
        logprobs = shapes.chat_logprobs(engine, [(event.token, event.logprob)]) if event.logprob else None
        return _chat_deltas(delta, logprobs)

    def on_end(result):
        delta, calls = parser.finish()
        return [*_chat_deltas(delta), *({"delta": d} for d in shapes.call_deltas(calls)),
                {"delta": {}, "finish_reason": shapes.finish_reason(result.finish_reason, calls)}]

    head = {**head, "object": "chat.completion.chunk"}
    return _sse(job, head, include_usage, on_event, on_end, first={"delta": {"role": "assistant", "content": ""}})


def _chat_deltas(delta, logprobs=None) -> list[dict]:
    out = []
    if delta.thinking:
        out.append({"delta": {"reasoning_content": delta.thinking}})
    if delta.content or logprobs:
        out.append({"delta": {"content": delta.content}, **({"logprobs": logprobs} if logprobs else {})})
    return out


async def completions(request: Request):
    body = await fields.json_body(request)
    entry = request.app.state.registry.get(fields.string(body, "model"), request.scope)
    _refuse_unsupported(body)
    if fields.integer(body, "best_of", 1) != 1:
        raise bad_request("'best_of' other than 1 is not supported")
    stream, include_usage = fields.boolean(body, "stream", False), _stream_options(body)
    n = _n(body, stream)
    prompt, tokens = await _prompt(entry, body.get("prompt"), fields.string(body, "suffix"))
    echo = fields.boolean(body, "echo", False)
    top = fields.integer(body, "logprobs", None, lo=0, hi=MAX_TOP_LOGPROBS)
    job = make_job(entry, tokens, _params(body, _grammar(body), top))
    head = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time()),
            "model": entry.name, "system_fingerprint": FINGERPRINT}
    if echo and prompt is None:
        prompt = entry.engine.detokenize(tokens)
    echoed = prompt if echo else ""
    engine = entry.engine
    if not stream:
        replies = await whole_replies(request.receive, job, lambda: ReplyStream(think=False), n)
        return JSONResponse({**head, "choices": [{
            "index": i, "text": echoed + r.content,
            "logprobs": None if top is None else shapes.completion_logprobs(engine, r.logprobs, len(echoed)),
            "finish_reason": shapes.finish_reason(r.result.finish_reason, [])} for i, r in enumerate(replies)],
            "usage": _usage([r.result for r in replies])})
    offset = [len(echoed)]

    def on_event(event):
        if not (event.text or event.logprob):
            return []
        logprobs = None
        if event.logprob:
            logprobs = shapes.completion_logprobs(engine, [(event.token, event.logprob)], offset[0])
            offset[0] += len(logprobs["tokens"][0])
        return [{"text": event.text, "logprobs": logprobs}]

    def on_end(result):
        return [{"text": "", "logprobs": None, "finish_reason": shapes.finish_reason(result.finish_reason, [])}]

    first = {"text": echoed, "logprobs": None} if echoed else None
    return _sse(job, head, include_usage, on_event, on_end, first=first)


async def _prompt(entry, prompt, suffix=None):
    """(text or None, tokens) of a completion prompt: a string, token ids, or a list holding one of them;
    with a suffix, the fill-in-the-middle prompt of the model's FIM tokens."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if suffix:
        if not isinstance(prompt, str):
            raise bad_request("'suffix' needs 'prompt' as a string")
        return prompt, await fim_tokens(entry, prompt, suffix)
    if isinstance(prompt, str):
        return prompt, await text_tokens(entry, prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return None, checked_token_ids(entry, prompt, "prompt")
    if isinstance(prompt, list) and len(prompt) > 1:
        raise bad_request("'prompt' holds several prompts: send one request per prompt")
    raise bad_request("'prompt' must be a string or a list of token ids")


def _sse(job: Job, head: dict, include_usage: bool, on_event, on_end, first) -> StreamResponse:
    """A stream of one choice: `on_event(event)` and, at the end, `on_end(result)` give its chunks' choices."""
    engine_stream = submit(job)  # before the 200: a full queue is still a 429
    usage = {"usage": None} if include_usage else {}

    def chunk(choice: dict) -> bytes:
        return sse({**head, "choices": [{"index": 0, "finish_reason": None, **choice}], **usage})

    async def chunks():
        if first is not None:
            yield chunk(first)
        async for event in engine_stream.events():
            if event.finish_reason == "error":
                yield sse({"error": {"message": f"generation failed: {event.error}", "type": "server_error",
                                     "param": None, "code": None}})
                break
            for choice in on_event(event):
                yield chunk(choice)
        else:
            result = engine_stream.result()
            for choice in on_end(result):
                yield chunk(choice)
            if include_usage:
                yield sse({**head, "choices": [], "usage": _usage([result])})
        yield sse("[DONE]")

    return StreamResponse(chunks(), SSE, engine_stream.cancel)


ROUTES = [
    Route("/v1/models", models, methods=["GET"]),
    Route("/v1/models/{model:path}", model, methods=["GET"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
]
