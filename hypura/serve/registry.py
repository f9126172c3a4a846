"""The models a server loaded at start, each with its engine, chat template and Ollama name.

Requests name a model; `Registry.get` resolves only names of these models (`name:tag`, and `name`
or `name:latest` when one loaded model has that name), never a path, so a client cannot make the
server open a file.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

from hypura.errors import HypuraError
from hypura.serve.chat_template import ChatTemplate, TemplateError
from hypura.serve.errors import ApiError
from hypura.serve.model_info import ModelInfo, model_info
from hypura.serve.prompt_tokens import Vocab, read_vocab
from hypura.serve.settings import ServeSettings


@dataclass
class ModelEntry:
    info: ModelInfo
    path: Path
    engine: object  # hypura.engine.Engine
    llm: object  # the hypura.Llama the engine drives
    template: Optional[ChatTemplate]
    template_error: Optional[str]  # why the GGUF's template could not be used, when it has one
    n_ctx: int  # context per sequence
    n_vocab: int
    loaded_at: datetime
    load_s: float
    size_vram: int  # bytes of weights in device memory
    vocab: Vocab = Vocab(max_token_bytes=64)  # what bounds tokenizing a prompt (prompt_tokens.py)

    @property
    def name(self) -> str:
        return self.info.name

    def chat_template(self) -> ChatTemplate:
        if self.template is not None:
            return self.template
        if self.template_error is not None:
            raise ApiError(500, f"model '{self.name}': {self.template_error}")
        raise ApiError(400, f"model '{self.name}' has no chat template (tokenizer.chat_template): send a raw "
                            "prompt instead (/api/generate with \"raw\": true, or /v1/completions)")


class Registry:
    def __init__(self):
        self.entries: dict[str, ModelEntry] = {}
        self._aliases: dict[str, str] = {}

    def add(self, entry: ModelEntry) -> None:
        if entry.name in self.entries:
            raise HypuraError(f"two models are named '{entry.name}' ({self.entries[entry.name].path} and "
                              f"{entry.path}): rename one of the files")
        self.entries[entry.name] = entry
        base = entry.name.split(":")[0]
        taken = any(n.split(":")[0] == base for n in self.entries if n != entry.name)
        for alias in (base, f"{base}:latest"):
            if taken:  # two models share the name: only name:tag picks one
                self._aliases.pop(alias, None)
            elif alias != entry.name:
                self._aliases[alias] = entry.name

    def get(self, name: Optional[str]) -> ModelEntry:
        if not name:
            raise ApiError(400, "'model' is required", "model_not_found")
        key = name.strip().lower()
        entry = self.entries.get(self._aliases.get(key, key))
        if entry is None:
            known = ", ".join(self.entries) or "none"
            raise ApiError(404, f"model '{name[:200]}' not found (this server has: {known})", "model_not_found")
        return entry

    def __iter__(self):
        return iter(list(self.entries.values()))  # a copy: the loader thread may add one meanwhile

    def close(self) -> None:
        for entry in self.entries.values():
            entry.engine.close()
            entry.llm.close()


def _token_text(llm, token: int) -> str:
    if token is None or token < 0:
        return ""
    return llm.detokenize([token], special=True).decode("utf-8", errors="replace")


def _device_bytes(llm) -> int:
    """Weight bytes in device memory: llama.cpp's buffer of each tensor (CUDA0, Metal...; not CPU or *_Host)."""
    total = 0
    for t in llm.header.tensors:
        buffer = llm.tensor_buffer(t.name) or "CPU"
        if "CPU" not in buffer and not buffer.endswith("_Host"):
            total += t.nbytes
    return total


def open_model(path: Path, settings: ServeSettings, start_engine: Callable) -> ModelEntry:
    """Load `path` with its engine (`start_engine(path, settings) -> (llm, engine)`) and read what the
    routes report about it. The chat template is parsed now, so a broken one is reported at start."""
    started = time.monotonic()
    llm, engine = start_engine(path, settings)
    load_s = time.monotonic() - started
    template, template_error = None, None
    source = llm.metadata.get("tokenizer.chat_template")
    if source:
        try:
            template = ChatTemplate(source, _token_text(llm, llm.token_bos()), _token_text(llm, llm.token_eos()))
        except TemplateError as e:
            template_error = str(e)
    return ModelEntry(info=model_info(path, llm.header), path=path, engine=engine, llm=llm, template=template,
                      template_error=template_error, n_ctx=int(engine.n_ctx_per_seq), n_vocab=int(llm.n_vocab()),
                      loaded_at=datetime.now(timezone.utc), load_s=load_s, size_vram=_device_bytes(llm),
                      **({"vocab": read_vocab(llm)} if hasattr(llm, "_model") else {}))  # stand-ins have none
