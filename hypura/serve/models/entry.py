"""A model the server offers (`Offer`) and one loaded (`ModelEntry`): what the routes read of it, and how it is
opened (`open_model`) and told apart from a file changed since (`file_identity`)."""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable, Optional

from hypura.chat_template import ChatTemplate, TemplateError
from hypura.serve.http.errors import ApiError
from hypura.serve.models.model_info import ModelInfo, model_info
from hypura.serve.models.prompt_tokens import Vocab, read_vocab
from hypura.serve.settings import ServeSettings


@dataclass(frozen=True)
class Offer:
    """A model the server can load: where it is, what /api/tags says of it, its Ollama params."""

    info: ModelInfo
    path: Path
    modified_at: datetime
    params: dict = field(default_factory=dict)  # Ollama's params layer: the model's default options
    aliases: tuple[str, ...] = ()  # short forms it answers to while no other model claims them

    @property
    def name(self) -> str:
        return self.info.name


@dataclass
class ModelEntry:
    info: ModelInfo
    path: Path
    engine: object  # hypura.engine.Engine
    llm: object  # the hypura.loaded.LoadedModel the engine drives
    template: Optional[ChatTemplate]
    template_error: Optional[str]  # why the GGUF's template could not be used, when it has one
    n_ctx: int  # context per sequence
    n_vocab: int
    loaded_at: datetime
    load_s: float
    size_vram: int  # bytes of weights in device memory
    params: dict = field(default_factory=dict)  # default options (Ollama's params layer), under a request's
    pinned: bool = True  # loaded at start and kept; False: on demand, unloaded when idle
    plan: str = ""  # what the planner chose for it, in one line (/api/ps)
    footprint: tuple[int, int] = (0, 0)  # (GPU, RAM) bytes it holds, as planned
    leases: int = 0  # requests using it now
    expires: float = math.inf  # time.monotonic() when it is unloaded, idle
    vocab: Vocab = Vocab(max_token_bytes=64)  # what bounds tokenizing a prompt (prompt_tokens.py)
    file_id: Optional[tuple] = None  # the file as it was when the load began (file_identity)
    retired: bool = False  # its file changed: no new leases, closed once its requests end

    @property
    def name(self) -> str:
        return self.info.name

    def file_changed(self) -> bool:
        """Another file at its path than the one loaded. A file deleted is not: the loaded copy serves on (its
        mapping and descriptors hold the old file) until another file lands there."""
        now = file_identity(self.path)
        return self.file_id is not None and now is not None and now != self.file_id

    def options(self, given: dict) -> dict:
        """A request's options over the model's defaults, as Ollama applies its params layer."""
        return {**self.params, **given}

    def expires_at(self) -> datetime:
        left = self.expires - time.monotonic() if not self.pinned and self.expires < math.inf else 100 * 365 * 86400
        return datetime.now(timezone.utc) + timedelta(seconds=max(0.0, left))

    def chat_template(self) -> ChatTemplate:
        if self.template is not None:
            return self.template
        if self.template_error is not None:
            raise ApiError(500, f"model '{self.name}': {self.template_error}")
        raise ApiError(400, f"model '{self.name}' has no chat template (tokenizer.chat_template): send a raw "
                            "prompt instead (/api/generate with \"raw\": true, or /v1/completions)")

    def close(self) -> None:
        self.engine.close()
        self.llm.close()


def _token_text(vocab, token: int) -> str:
    if token is None or token < 0:
        return ""
    return vocab.piece(token, True).decode("utf-8", errors="replace")


def _device_bytes(llm) -> int:
    """Weight bytes in device memory: llama.cpp's buffer of each tensor (CUDA0, Metal...; not CPU or *_Host)."""
    total = 0
    for t in llm.header.tensors:
        buffer = llm.tensor_buffer(t.name) or "CPU"
        if "CPU" not in buffer and not buffer.endswith("_Host"):
            total += t.nbytes
    return total


def open_model(path: Path, settings: ServeSettings, start_engine: Callable, name: Optional[str] = None) -> ModelEntry:
    """Load `path` with its engine (`start_engine(path, settings) -> (llm, engine)`) and read what the
    routes report about it. The chat template is parsed now, so a broken one is reported at load."""
    file_id = file_identity(path)  # before the load: a change during it is a change too
    started = time.monotonic()
    llm, engine = start_engine(path, settings)
    load_s = time.monotonic() - started
    template, template_error = None, None
    source = llm.metadata.get("tokenizer.chat_template")
    if source:
        try:
            template = ChatTemplate(source, _token_text(llm.vocab, llm.vocab.bos), _token_text(llm.vocab, llm.vocab.eos))
        except TemplateError as e:
            template_error = str(e)
    return ModelEntry(info=model_info(path, llm.header, name), path=path, engine=engine, llm=llm, template=template,
                      template_error=template_error, n_ctx=int(engine.n_ctx_per_seq), n_vocab=int(llm.n_vocab()),
                      loaded_at=datetime.now(timezone.utc), load_s=load_s, size_vram=_device_bytes(llm),
                      file_id=file_id,
                      **({"vocab": read_vocab(llm)} if hasattr(llm, "context") else {}))  # stand-ins have none


def file_identity(path: Path) -> Optional[tuple]:
    """What tells a file replaced, cut or written from the one loaded: (device, inode, size, mtime); None when
    it cannot be read."""
    try:
        s = os.stat(path)
    except OSError:
        return None
    return s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns


def offer_of(stored, header) -> Offer:
    """A store's model (hypura.store.StoredModel) as offered: /api/tags' digest and size as Ollama's own."""
    info = model_info(stored.path, header, stored.name)
    info = dataclasses.replace(info, digest=stored.digest or info.digest, size=stored.size or info.size)
    return Offer(info, stored.path, datetime.fromtimestamp(stored.modified, timezone.utc), dict(stored.params),
                 stored.aliases)
