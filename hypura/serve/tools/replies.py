"""Whole replies, split into thinking, text and tool calls, with their tokens' logprobs; and `n` replies to
one prompt, sharing its KV: the first is submitted alone, the others once its prompt is in the cache
(the engine's prefix cache then copies it to them instead of evaluating it again)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Callable

from hypura.engine import Result
from hypura.engine.types import TokenLogprob
from hypura.serve.generate.bridge import EngineStream
from hypura.serve.generate.generation import Job, submit
from hypura.serve.http.errors import ApiError
from hypura.serve.http.streaming import race_disconnect
from hypura.serve.tools import ToolCall
from hypura.serve.tools.stream import ReplyStream


@dataclass
class Reply:
    result: Result
    thinking: str = ""
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    logprobs: list[tuple[int, TokenLogprob]] = field(default_factory=list)  # (token, its logprobs)


async def open_streams(job: Job, n: int) -> list[EngineStream]:
    streams = [submit(job)]
    try:
        if n > 1:
            await streams[0].started()
            streams += [submit(job) for _ in range(n - 1)]
    except BaseException:
        for s in streams:
            s.cancel()
        raise
    return streams


async def collect(stream: EngineStream, parser: ReplyStream) -> Reply:
    thinking, content, logprobs = [], [], []
    async for event in stream.events():
        delta = parser.push(event.text)
        thinking.append(delta.thinking)
        content.append(delta.content)
        if event.logprob is not None:
            logprobs.append((event.token, event.logprob))
    result = stream.result()
    if result.finish_reason == "error":
        raise ApiError(500, f"generation failed: {stream.final.error if stream.final else result.error}")
    delta, calls = parser.finish()
    return Reply(result, "".join(thinking) + delta.thinking, "".join(content) + delta.content, calls, logprobs)


async def whole_replies(receive, job: Job, parser: Callable[[], ReplyStream], n: int = 1) -> list[Reply]:
    """`n` whole replies to `job`, cancelled if the client disconnects first."""
    async def work():
        streams = await open_streams(job, n)
        try:
            return await asyncio.gather(*(collect(s, parser()) for s in streams))
        finally:
            for s in streams:
                s.cancel()

    return await race_disconnect(receive, work())
