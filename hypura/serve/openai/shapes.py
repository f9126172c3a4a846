"""OpenAI's shapes for what a reply holds beyond text: tool calls (whole, and as stream deltas), reasoning
content and logprobs (chat's `content` list, completions' parallel lists)."""

from __future__ import annotations

import math

from hypura.engine.types import TokenLogprob
from hypura.serve.tools import ToolCall
from hypura.serve.tools.replies import Reply

ARGUMENT_PIECE = 32  # characters of arguments per streamed delta, as OpenAI streams them in pieces


def _call(call: ToolCall) -> dict:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments_json()}}


def message(reply: Reply) -> dict:
    out = {"role": "assistant", "content": reply.content if (reply.content or not reply.calls) else None}
    if reply.thinking:
        out["reasoning_content"] = reply.thinking
    if reply.calls:
        out["tool_calls"] = [_call(c) for c in reply.calls]
    return out


def finish_reason(reason: str, calls) -> str:
    if calls:
        return "tool_calls"
    return "length" if reason == "length" else "stop"


def call_deltas(calls: list[ToolCall]) -> list[dict]:
    """The deltas of a streamed reply's calls: each one's id and name, then its arguments in pieces."""
    out = []
    for i, call in enumerate(calls):
        out.append({"tool_calls": [{"index": i, "id": call.id, "type": "function",
                                    "function": {"name": call.name, "arguments": ""}}]})
        arguments = call.arguments_json()
        for at in range(0, len(arguments), ARGUMENT_PIECE):
            out.append({"tool_calls": [{"index": i, "function": {"arguments": arguments[at:at + ARGUMENT_PIECE]}}]})
    return out


def _text(engine, token: int) -> tuple[str, list[int]]:
    raw = engine.token_bytes(token)
    return raw.decode("utf-8", errors="replace"), list(raw)


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else -9999.0  # JSON has no -inf; OpenAI's floor for "never"


def chat_logprobs(engine, items: list[tuple[int, TokenLogprob]]) -> dict:
    content = []
    for token, lp in items:
        text, raw = _text(engine, token)
        top = []
        for t, v in lp.top:
            t_text, t_raw = _text(engine, t)
            top.append({"token": t_text, "logprob": _finite(v), "bytes": t_raw})
        content.append({"token": text, "logprob": _finite(lp.logprob), "bytes": raw, "top_logprobs": top})
    return {"content": content, "refusal": None}


def completion_logprobs(engine, items: list[tuple[int, TokenLogprob]], offset: int) -> dict:
    """Completions' legacy shape; `offset`: characters before the first token (an echoed prompt)."""
    tokens, logprobs, tops, offsets = [], [], [], []
    for token, lp in items:
        text, _ = _text(engine, token)
        tokens.append(text)
        logprobs.append(_finite(lp.logprob))
        tops.append({_text(engine, t)[0]: _finite(v) for t, v in lp.top})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}
