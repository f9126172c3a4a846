"""`hypura serve`'s settings, read once from its flags; every bound the server enforces is here."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Union

from hypura.errors import HypuraError
from hypura.serve.keep_alive import DEFAULT_S as DEFAULT_KEEP_ALIVE_S

if TYPE_CHECKING:
    from hypura.speculative.settings import SpecSettings

DEFAULT_HOST = "127.0.0.1"  # closed by default: reachable from this machine only unless --host says otherwise
DEFAULT_PORT = 11434  # Ollama's port, so that Ollama clients find the server without configuration
DEFAULT_MAX_LOADED = 3  # Ollama's OLLAMA_MAX_LOADED_MODELS default (3 a GPU, 3 on the CPU)
DEFAULT_CTX_PER_SEQ = 4096  # tokens a sequence holds when -c is not given and the model was trained on enough
MIN_CTX_PER_SEQ = 16  # -c's floor: a prompt and a reply of a few tokens


@dataclass(frozen=True)
class ServeSettings:
    # loaded at start and kept: GGUF paths, or hypura.store.StoredModel (a name resolved, with its defaults);
    # none: every model the stores hold is offered, loaded on its first request, unloaded when idle
    models: tuple = ()
    models_dir: Optional[Path] = None  # a folder of GGUFs offered too (hypura.store)
    keep_alive: float = DEFAULT_KEEP_ALIVE_S  # seconds an on-demand model stays loaded idle (math.inf: kept)
    max_loaded: int = DEFAULT_MAX_LOADED  # on-demand models loaded at once
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    parallel: int = 4  # sequences decoded together per llama_decode (the engine's batch)
    n_ctx: Optional[int] = None  # context per sequence, in tokens (-c); None: ctx_per_seq() decides per model
    gpu_mem: Union[int, str, None] = None  # budgets passed to hypura.Llama, which plans placement from them
    ram: Union[int, str, None] = None
    api_key: Optional[str] = None  # when set, every route but /health wants "Authorization: Bearer KEY"
    max_queue: int = 64  # requests waiting for a sequence beyond `parallel`; more get 429
    # reuse the KV of a shared prefix (a chat's earlier turns) instead of evaluating it again; off, a reply
    # depends on its prompt alone (a reused prefix's KV was computed in other batches: near ties can flip)
    prefix_cache: bool = True
    # the sequences present share the KV cache's cells (-kvu, EngineConfig.kv_unified); off: n_ctx each
    kv_unified: bool = False
    # a 128k-token conversation is about 0.5 MB of JSON; nothing larger (no images) is accepted
    max_body_bytes: int = 8 << 20
    # seconds a request's headers, then its body, may take to arrive (a slow or stalled client is dropped)
    timeout_s: float = 60.0
    allowed_hosts: tuple[str, ...] = ()  # Host names answered besides loopback and --host (http/origins.py)
    cors_origins: tuple[str, ...] = ()  # web origins whose pages may call the server, besides loopback pages
    speculative: Optional["SpecSettings"] = None  # each sequence's drafts verified in the engine's steps; None: off
    llama_kwargs: dict = field(default_factory=dict)  # further hypura.Llama keyword arguments (n_threads, ...)

    def __post_init__(self):
        bad = []
        if self.max_loaded < 1 or not self.keep_alive >= 0:
            bad.append(f"--max-loaded {self.max_loaded} / --keep-alive {self.keep_alive} (want >= 1 / >= 0)")
        if not 0 <= self.port <= 65535:
            bad.append(f"--port {self.port} (want 0..65535)")
        if self.parallel < 1:
            bad.append(f"--parallel {self.parallel} (want >= 1)")
        if self.n_ctx is not None and self.n_ctx < MIN_CTX_PER_SEQ:
            bad.append(f"-c {self.n_ctx} (want >= {MIN_CTX_PER_SEQ} tokens per sequence)")
        if self.max_queue < 1 or self.max_body_bytes < 1024:
            bad.append(f"--max-queue {self.max_queue} / max_body_bytes {self.max_body_bytes} (want >= 1 / >= 1024)")
        if not 0 < self.timeout_s <= 86400:
            bad.append(f"--timeout {self.timeout_s:g} (want 0 < seconds <= 86400)")
        if self.api_key is not None and not self.api_key.strip():
            bad.append("--api-key is empty")
        if bad:
            raise HypuraError("bad serve settings: " + "; ".join(bad))

    def ctx_per_seq(self, header) -> int:
        """Tokens each of the `parallel` sequences holds for the model of `header`: -c when given (the user asks
        for it, past the training context too); else DEFAULT_CTX_PER_SEQ, held to the training context over the
        sequences. The sequences share one unified KV cache, which llama.cpp takes for one sequence's context
        (n_ctx_seq: its RoPE factors are chosen by it), so the whole cache stays within what the model was
        trained on, as llama-server's default context (n_ctx_train over its slots)."""
        if self.n_ctx is not None:
            return self.n_ctx
        n_train = int(header.get("context_length", 0) or 0)
        if not n_train:
            return DEFAULT_CTX_PER_SEQ
        return max(MIN_CTX_PER_SEQ, min(DEFAULT_CTX_PER_SEQ, n_train // self.parallel))
