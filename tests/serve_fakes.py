"""A stand-in engine and Llama for the server's route tests: the Engine contract (hypura/engine/__init__.py)
with canned output, so that every route, error and disconnect runs in milliseconds without a model; the
real Server over it (`start_fake`), and parsers of NDJSON and SSE bodies."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from hypura.engine import EngineClosed, Event, PromptTooLong, QueueFull, Result, SamplingParams
from hypura.modelfile import read_header

MODEL = "smollm2-135m-instruct:q4_1"


class FakeRequest:
    def __init__(self, engine, tokens, params, on_event):
        self.engine, self.tokens, self.params, self.on_event = engine, tokens, params, on_event
        self.cancelled = threading.Event()
        self._done = threading.Event()
        self._result = None

    def cancel(self):
        self.cancelled.set()

    @property
    def done(self):
        return self._done.is_set()

    def result(self, timeout=None):
        if not self._done.wait(timeout):
            raise TimeoutError("not finished")
        return self._result

    def run(self):
        """Words 'w0 w1 ...' one per `engine.token_s`, up to max_tokens (or `engine.default_len`)."""
        started = time.perf_counter()
        n = self.params.max_tokens if self.params.max_tokens > 0 else self.engine.default_len
        words, reason, error = [], "length", None
        for i in range(n):
            if self.cancelled.wait(self.engine.token_s):
                reason = "cancelled"
                break
            if self.engine.fail_after is not None and i == self.engine.fail_after:
                reason, error = "error", "weights could not be read"
                break
            word = f"w{i} "
            if any(s in "".join(words) + word for s in self.params.stop):
                reason = "stop"
                break
            words.append(word)
            self.on_event(Event(text=word, token=100 + i))
        self._result = Result(text="".join(words), tokens=tuple(range(100, 100 + len(words))), finish_reason=reason,
                              prompt_tokens=len(self.tokens), cached_tokens=0, queued_s=0.0, prompt_s=0.001,
                              decode_s=time.perf_counter() - started, error=error)
        self._done.set()
        self.on_event(Event(text="", finish_reason=reason, error=error))
        self.engine._finished(self)


class FakeEngine:
    """submit() runs each request on a thread of its own; `parallel` + `max_queue` may be in flight."""

    def __init__(self, n_ctx=512, parallel=2, max_queue=2, token_s=0.002, default_len=8):
        self.n_ctx_per_seq, self.parallel, self.max_queue = n_ctx, parallel, max_queue
        self.token_s, self.default_len, self.fail_after = token_s, default_len, None
        self.active: list[FakeRequest] = []
        self.submitted: list[FakeRequest] = []
        self.closed = False
        self._lock = threading.Lock()

    def submit(self, tokens, params: SamplingParams, on_event=None):
        if self.closed:
            raise EngineClosed("closed")
        if len(tokens) >= self.n_ctx_per_seq:
            raise PromptTooLong(f"prompt of {len(tokens)} tokens does not fit {self.n_ctx_per_seq}")
        with self._lock:
            if len(self.active) >= self.parallel + self.max_queue:
                raise QueueFull("queue full")
            req = FakeRequest(self, tokens, params, on_event or (lambda e: None))
            self.active.append(req)
            self.submitted.append(req)
        threading.Thread(target=req.run, daemon=True).start()
        return req

    def _finished(self, req):
        with self._lock:
            self.active.remove(req)

    def tokenize(self, text, add_special=True, parse_special=True):
        return ([1] if add_special else []) + [200 + (b % 50) for b in text.encode()]

    def detokenize(self, tokens):
        return "".join(chr(65 + t % 26) for t in tokens)

    def fim_tokens(self):
        return None  # no fill-in-the-middle tokens, as the default model

    def metrics(self):
        return {"requests_total": len(self.submitted), "active_sequences": len(self.active), "queue_length": 0,
                "llama": {"decode": {"tok_s": 12.5}, "bytes_per_token": {"ram": 1024, "disk": 0}}}

    def close(self):
        self.closed = True


class FakeVocab:
    bos, eos = 1, 2

    def piece(self, token, special=True):
        return {1: b"<|im_start|>", 2: b"<|im_end|>"}[token]


class FakeLlama:
    """What the registry reads of a loaded model: header, metadata, special tokens, vocabulary size."""

    vocab = FakeVocab()

    def __init__(self, path: Path, template=None):
        self.header = read_header(path)
        self.metadata = {k: v for k, v in self.header.metadata.items()}
        if template is not None:
            self.metadata["tokenizer.chat_template"] = template
        self.closed = False

    def n_vocab(self):
        return 49152

    def tensor_buffer(self, name):
        return "CPU"

    def close(self):
        self.closed = True


def start_fake(path, engine=None, template=None, gate=None, **settings):
    """The real Server (uvicorn on 127.0.0.1, a free port) over a FakeEngine; `gate`: loading waits for it."""
    from hypura.serve.server import Server
    from hypura.serve.settings import ServeSettings

    engine = engine or FakeEngine()

    def starter(p, s):
        if gate is not None:
            gate.wait(10)
        return FakeLlama(p, template), engine

    server = Server(ServeSettings(models=(path,), port=0, **settings), engine_starter=starter, log_level="warning")
    server.engine = engine
    server.start()
    if gate is None:
        wait_ready(server)
    return server


def wait_ready(server, timeout=10):
    deadline = time.monotonic() + timeout
    while not server.state.ready:
        assert time.monotonic() < deadline, server.state.error
        time.sleep(0.01)


def ndjson_lines(response) -> list[dict]:
    return [json.loads(line) for line in response.text.splitlines() if line]


def sse_events(response) -> list:
    out = []
    for block in response.text.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out
