"""OpenAI's API: /v1/models, /v1/chat/completions, /v1/completions, with the same model names as Ollama's.

Streams are server-sent events ending with `data: [DONE]`; `stream_options.include_usage` adds the
usage chunk before it. Sampling defaults are llama.cpp's (as llama-cpp-python's and llama.cpp's
servers use), and llama.cpp's extra fields `top_k`, `min_p`, `repeat_penalty` and `ignore_eos` are
honoured too.
What the server cannot do (n > 1, logprobs, logit_bias, tools, JSON response formats, images,
suffix) is a 400 that says so.
"""

from __future__ import annotations

import time
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import hypura
from hypura.serve import fields
from hypura.serve.errors import ApiError, bad_request
from hypura.serve.generation import Finished, Job, chat_tokens, checked_token_ids, make_job, run_to_end, sampling, \
    submit, text_tokens
from hypura.serve.streaming import SSE, StreamResponse, race_disconnect, sse

MAX_STOPS = 4  # OpenAI's limit
FINGERPRINT = f"hypura-{hypura.__version__}"


def _model_card(offer) -> dict:
    return {"id": offer.name, "object": "model", "created": int(offer.modified_at.timestamp()), "owned_by": "hypura"}


async def models(request: Request):
    return JSONResponse({"object": "list", "data": [_model_card(o) for o in request.app.state.registry.offers()]})


async def model(request: Request):
    return JSONResponse(_model_card(request.app.state.registry.find(request.path_params["model"])))


def _refuse_unsupported(body: dict) -> None:
    if fields.integer(body, "n", 1) != 1:
        raise bad_request("'n' other than 1 is not supported: send one request per completion")
    if body.get("logprobs") or body.get("top_logprobs"):
        raise bad_request("'logprobs' is not supported")
    if body.get("logit_bias"):
        raise bad_request("'logit_bias' is not supported")
    if body.get("tools") or body.get("functions"):
        raise bad_request("tools and functions are not supported")
    response_format = body.get("response_format")
    if response_format not in (None, {}) and response_format != {"type": "text"}:
        raise bad_request("'response_format' other than text (JSON mode, schemas) is not supported")


def _params(body: dict):
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
    )


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


def _usage(finished: Finished) -> dict:
    r = finished.result
    return {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
            "total_tokens": r.prompt_tokens + r.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": r.cached_tokens}}


def _finish_reason(reason: str) -> str:
    return "length" if reason == "length" else "stop"


def _stream_options(body: dict) -> bool:
    return fields.boolean(fields.mapping(body, "stream_options"), "include_usage", False)


async def chat_completions(request: Request):
    body = await fields.json_body(request)
    entry = request.app.state.registry.get(fields.string(body, "model"))
    _refuse_unsupported(body)
    messages = _messages(body)
    stream, include_usage, params = fields.boolean(body, "stream", False), _stream_options(body), _params(body)
    job = make_job(entry, await chat_tokens(entry, messages), params)
    head = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": entry.name,
            "system_fingerprint": FINGERPRINT}
    if not stream:
        finished = await _whole(request, job)
        return JSONResponse({**head, "object": "chat.completion", "choices": [{
            "index": 0, "message": {"role": "assistant", "content": finished.result.text}, "logprobs": None,
            "finish_reason": _finish_reason(finished.result.finish_reason)}], "usage": _usage(finished)})
    head = {**head, "object": "chat.completion.chunk"}
    return _sse(job, head, include_usage, lambda text: {"delta": {"content": text}},
                first={"delta": {"role": "assistant", "content": ""}}, last={"delta": {}})


async def completions(request: Request):
    body = await fields.json_body(request)
    entry = request.app.state.registry.get(fields.string(body, "model"))
    _refuse_unsupported(body)
    if fields.string(body, "suffix"):
        raise bad_request("'suffix' is not supported")
    if fields.integer(body, "best_of", 1) != 1:
        raise bad_request("'best_of' other than 1 is not supported")
    prompt, tokens = await _prompt(entry, body.get("prompt"))
    echo = fields.boolean(body, "echo", False)
    stream, include_usage, params = fields.boolean(body, "stream", False), _stream_options(body), _params(body)
    job = make_job(entry, tokens, params)
    head = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time()),
            "model": entry.name, "system_fingerprint": FINGERPRINT}
    if echo and prompt is None:
        prompt = entry.engine.detokenize(tokens)
    echoed = prompt if echo else ""
    if not stream:
        finished = await _whole(request, job)
        return JSONResponse({**head, "choices": [{
            "index": 0, "text": echoed + finished.result.text, "logprobs": None,
            "finish_reason": _finish_reason(finished.result.finish_reason)}], "usage": _usage(finished)})
    return _sse(job, head, include_usage, lambda text: {"text": text, "logprobs": None},
                first={"text": echoed, "logprobs": None} if echoed else None, last={"text": "", "logprobs": None})


async def _prompt(entry, prompt):
    """(text or None, tokens) of a completion prompt: a string, token ids, or a list holding one of them."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt, await text_tokens(entry, prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return None, checked_token_ids(entry, prompt, "prompt")
    if isinstance(prompt, list) and len(prompt) > 1:
        raise bad_request("'prompt' holds several prompts: send one request per prompt")
    raise bad_request("'prompt' must be a string or a list of token ids")


async def _whole(request: Request, job: Job) -> Finished:
    finished = await race_disconnect(request.receive, run_to_end(job))
    if finished.result.finish_reason == "error":
        raise ApiError(500, f"generation failed: {finished.error}")
    return finished


def _sse(job: Job, head: dict, include_usage: bool, piece, first, last) -> StreamResponse:
    engine_stream = submit(job)  # before the 200: a full queue is still a 429
    usage = {"usage": None} if include_usage else {}

    def chunk(choice: dict, finish_reason=None) -> bytes:
        return sse({**head, "choices": [{"index": 0, **choice, "finish_reason": finish_reason}], **usage})

    async def chunks():
        if first is not None:
            yield chunk(first)
        async for event in engine_stream.events():
            if event.finish_reason == "error":
                yield sse({"error": {"message": f"generation failed: {event.error}", "type": "server_error",
                                     "param": None, "code": None}})
                break
            if event.text:
                yield chunk(piece(event.text))
        else:
            result = engine_stream.result()
            yield chunk(last, _finish_reason(result.finish_reason))
            if include_usage:
                yield sse({**head, "choices": [], "usage": _usage(Finished(result.text, result, None))})
        yield sse("[DONE]")

    return StreamResponse(chunks(), SSE, engine_stream.cancel)


ROUTES = [
    Route("/v1/models", models, methods=["GET"]),
    Route("/v1/models/{model:path}", model, methods=["GET"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
]
