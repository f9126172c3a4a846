"""The models a server offers, and those loaded now: loaded at start and kept (`serve -m`), or loaded on
a request's demand and unloaded when idle (`serve` with no -m: every model the stores hold).

Requests name a model; names resolve only to models on offer (`name:tag`, Ollama's long forms, and
for models from files `name` or `name:latest` when one model has that name), never to a path, so a
client cannot make the server open a file.

Concurrency protocol (threads: uvicorn's event loop, one loader thread, one janitor thread):
  - `_lock` guards `entries`, `_loading`, each entry's `leases` and `expires`, and `_waiting`; it is held
    only for dictionary updates, never across a load, an unload or an await. `_idle` is its condition.
  - `_mem` serializes what changes memory: each load (planning included) and each unload holds it from
    choosing what to unload until the model is open or closed, so a plan always sees the models that
    stay. Lock order: `_mem`, then `_lock`. The event loop never takes `_mem`.
  - `acquire` (event loop): a loaded model is leased at once, under `_lock` alone, so requests for it are
    never held up by another model's load. Otherwise the request joins the model's load (one per name,
    on the loader thread) as a waiter, waits at most LOAD_WAIT_S, and turns into a lease under `_lock`.
    Entries with leases or waiters are never unloaded.
  - `release` (event loop): drops the lease and sets `expires` (now + keep_alive); the janitor unloads
    entries past `expires` with neither leases nor waiters. keep_alive 0 expires at once.
  - A loaded model whose file changed since its load (another inode, size or mtime: replaced, cut or written)
    is retired by the `acquire` that finds it: out of `entries` (the request loads the file again, a kept
    model as kept), into `_retired` until its leases end; the janitor, or the next load, closes it. A model
    has one retired copy serving at most: a further change waits for its requests to end (retired.py). The
    gate hands each route the entry it leased (`scope[LEASED]`), so a request never serves another copy.
  - `close` (shutdown): queued loads are cancelled (their waiters get 503), a load under way is closed
    as soon as it ends, and every entry is closed.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import ctypes
import functools
import logging
import math
import threading
import time
from typing import Callable, Optional

from hypura.errors import HypuraError
from hypura.serve.http.errors import ApiError
from hypura.serve.models.entry import ModelEntry, Offer, open_model
from hypura.serve.models.retired import Retired
from hypura.serve.settings import ServeSettings
from hypura.store import names

log = logging.getLogger("hypura.serve")

LEASED = "hypura.model"  # the ASGI scope key under which the gate hands a route the entry it leased
LOAD_WAIT_S = 600  # a request waits this long for its model's load (a 70B from disk takes minutes on slow disks)


class Registry:
    def __init__(self, settings: Optional[ServeSettings] = None, start_engine: Optional[Callable] = None):
        self.settings, self.start_engine = settings, start_engine
        self.entries: dict[str, ModelEntry] = {}
        self._offers: dict[str, Offer] = {}
        self._broken: dict[str, str] = {}  # name -> why it cannot be loaded (one line)
        self._aliases: dict[str, str] = {}
        self._kept: set[str] = set()  # names loaded at start (serve -m): loaded again as kept
        self._retired = Retired()  # file changed while loaded: closed once their leases end
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._mem = threading.Lock()
        self._loading: dict[str, concurrent.futures.Future] = {}
        self._waiting: collections.Counter = collections.Counter()
        self._closing = False
        self._loader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hypura-serve-load")
        self._janitor: Optional[threading.Thread] = None

    # --- what is on offer -------------------------------------------------------------------------
    def offer(self, offer: Offer) -> None:
        if offer.name in self._offers:
            raise HypuraError(f"two models are named '{offer.name}' ({self._offers[offer.name].path} and "
                              f"{offer.path}): rename one of the files")
        self._offers[offer.name] = offer
        claims = collections.Counter(a for o in self._offers.values() for a in set(o.aliases) - {o.name})
        self._aliases = {a: o.name for o in self._offers.values() for a in o.aliases
                         if claims[a] == 1 and a not in self._offers}

    def broken(self, name: str, line: str) -> None:
        self._broken[name] = line

    def offers(self) -> list[Offer]:
        return list(self._offers.values())

    def find(self, name: Optional[str]) -> Offer:
        if not name:
            raise ApiError(400, "'model' is required", "model_not_found")
        typed = name.strip().lower()
        for key in (typed, names.parse(typed).short()):
            key = self._aliases.get(key, key)
            if key in self._offers:
                return self._offers[key]
            if key in self._broken:
                raise ApiError(500, f"model '{key}' cannot be loaded: {self._broken[key]}")
        known = ", ".join(self._offers) or "none"
        raise ApiError(404, f"model '{name[:200]}' not found (this server has: {known})", "model_not_found")

    # --- loaded models ----------------------------------------------------------------------------
    def get(self, name: Optional[str], scope: Optional[dict] = None) -> ModelEntry:
        """The model a route serves: the entry the gate leased for this request (`scope[LEASED]`: it stays the
        request's while a changed file is loaded again), else the loaded model `name` names."""
        if scope is not None and scope.get(LEASED) is not None:
            return scope[LEASED]
        offer = self.find(name)
        entry = self.entries.get(offer.name)
        if entry is None:
            raise ApiError(503, f"model '{offer.name}' is not loaded", None, {"Retry-After": "1"})
        return entry

    def __iter__(self):
        with self._lock:
            return iter(list(self.entries.values()))  # a copy: loads and unloads go on meanwhile

    async def acquire(self, name: Optional[str]) -> ModelEntry:
        """The model, loaded (waiting for its load, bounded) and leased until `release`."""
        offer = self.find(name)
        deadline = time.monotonic() + LOAD_WAIT_S
        while True:
            with self._lock:
                entry, drained = self.entries.get(offer.name), None
                if entry is not None and entry.file_changed():  # one stat: a replaced file is served as it is now
                    drained = self._retired.serving(offer.name)  # changed again: after the retired copy's requests
                    if drained is None:
                        self._retire(entry)
                    entry = None
                if drained is None:
                    if entry is not None:
                        entry.leases += 1
                        return entry
                    if self._closing:
                        raise ApiError(503, "the server is stopping")
                    future = self._loading.get(offer.name)
                    if future is None:
                        future = self._loading[offer.name] = self._loader.submit(self._load, offer)
                    self._waiting[offer.name] += 1
                    break
            log.info("%s: its file changed again while the copy loaded before still serves requests: waiting for "
                     "them", offer.name)
            await _within(drained, deadline, f"model '{offer.name}': its file changed again while the copy loaded "
                                             f"before still serves requests; waited {LOAD_WAIT_S} s for them")
        try:
            await _within(future, deadline, f"model '{offer.name}' is still loading after {LOAD_WAIT_S} s")
        except asyncio.CancelledError:
            if future.cancelled():  # a queued load, cancelled at shutdown (not this request)
                raise ApiError(503, "the server is stopping") from None
            raise
        except ApiError:
            raise
        except Exception as e:  # HypuraError, ModelFileError, llama.cpp's ValueError: one line, no traceback
            raise ApiError(500, f"model '{offer.name}' failed to load: {e}") from None
        finally:
            with self._lock:
                self._waiting[offer.name] -= 1
                entry = self.entries.get(offer.name)
                if entry is not None and future.done() and not future.cancelled() and future.exception() is None:
                    entry.leases += 1
        if entry is None:
            raise ApiError(503, "the server is stopping")
        return entry

    def release(self, entry: ModelEntry, keep_alive: Optional[float]) -> None:
        """A request is done with `entry`: it stays loaded `keep_alive` seconds (None: the server's default)."""
        keep = self.settings.keep_alive if keep_alive is None and self.settings else keep_alive
        with self._lock:
            entry.leases -= 1
            if not entry.retired:
                entry.expires = time.monotonic() + (math.inf if keep is None else keep)
            self._retired.released(entry)
            self._idle.notify_all()

    def _retire(self, entry: ModelEntry) -> None:
        """Under `_lock`: `entry`'s file changed; the next lease loads it again."""
        log.warning("%s: %s changed since it was loaded: loading it again", entry.name, entry.path)
        del self.entries[entry.name]
        self._retired.add(entry)
        self._idle.notify_all()

    def _close_retired(self) -> None:
        """Close the retired entries no request uses any more (under `_mem`)."""
        with self._lock:
            done = self._retired.take_idle()
        for entry in done:
            self._unload(entry, "its file changed")
        if done:
            _trim_heap()

    def unload(self, name: Optional[str]) -> bool:
        """keep_alive 0 with nothing to generate: unload now if idle (else when its requests end). False when
        it was not loaded or is kept (loaded at start)."""
        offer = self.find(name)
        with self._mem:
            with self._lock:
                entry = self.entries.get(offer.name)
                if entry is None or entry.pinned:
                    return False
                entry.expires = time.monotonic()
                gone = entry.leases == 0 and self._waiting[offer.name] == 0
                if gone:
                    del self.entries[offer.name]
            if gone:
                self._unload(entry, "keep_alive 0")
        return True

    # --- loading and unloading (loader thread, janitor thread) -------------------------------------------
    def load_pinned(self, offer: Offer) -> ModelEntry:
        """Load at start, kept until the server stops (the server's loader thread)."""
        entry = open_model(offer.path, self.settings, self.start_engine, offer.name)
        entry.info, entry.params = offer.info, offer.params  # the store's digest and size, as /api/tags
        self.offer(offer)
        with self._lock:
            self.entries[entry.name] = entry
            self._kept.add(entry.name)
        return entry

    def _open(self, offer: Offer) -> ModelEntry:
        """Load `offer` (under `_mem`): a kept model as at start, else within the room make_room leaves."""
        from hypura.serve.models.room import make_room

        if offer.name in self._kept:  # its file changed: loaded again as the server loaded it at start
            log.info("loading %s again", offer.name)
            entry = open_model(offer.path, self.settings, self.start_engine, offer.name)
            entry.info, entry.params = offer.info, offer.params
            return entry
        room = make_room(self, offer)
        for gone in room.unloaded:
            self._unload(gone, f"to make room for {offer.name}")
        lines = []
        settings = room.settings_for(self.settings, lambda line: (lines.append(line), log.info("%s", line)))
        log.info("loading %s: %s", offer.name, room.describe())
        entry = open_model(offer.path, settings, self.start_engine, offer.name)
        entry.info, entry.params, entry.pinned = offer.info, offer.params, False
        entry.plan = room.chosen(entry, lines)
        entry.footprint = room.footprint(entry)
        return entry

    def _load(self, offer: Offer) -> ModelEntry:
        try:
            with self._mem:
                if self._closing:
                    raise ApiError(503, "the server is stopping")
                self._close_retired()
                entry = self._open(offer)
                with self._lock:
                    closing = self._closing
                    if not closing:
                        entry.expires = time.monotonic() + self.settings.keep_alive
                        self.entries[entry.name] = entry
                        self._idle.notify_all()
                if closing:  # the server stopped while it loaded
                    entry.close()
                    raise ApiError(503, "the server is stopping")
                log.info("loaded %s in %.1f s", entry.name, entry.load_s)
                if entry.template_error:
                    log.warning("%s: %s (chat routes will answer 500)", entry.name, entry.template_error)
                return entry
        except Exception as e:
            log.warning("loading %s failed: %s", offer.name, e)
            raise
        finally:
            with self._lock:
                self._loading.pop(offer.name, None)

    def loaded(self) -> tuple[list[ModelEntry], list[ModelEntry]]:
        """(the entries loaded now, those of them that may be unloaded now, least recently used first)."""
        with self._lock:  # retired entries still in use hold their memory too
            return list(self.entries.values()) + list(self._retired), self.idle()

    def take_idle(self, entries: list[ModelEntry]) -> list[ModelEntry]:
        """Take those of `entries` still idle out of the registry (a request may have leased one meanwhile: it
        stays), to close them; returns those taken. The caller holds `_mem` (a load making room)."""
        with self._lock:
            gone = [e for e in entries if self.entries.get(e.name) is e and e in self.idle()]
            for e in gone:
                del self.entries[e.name]
        return gone

    def idle(self) -> list[ModelEntry]:
        """Entries that may be unloaded now, least recently used first (call under `_lock`)."""
        idle = [e for e in self.entries.values() if not e.pinned and e.leases == 0 and not self._waiting[e.name]]
        return sorted(idle, key=lambda e: e.expires)

    def _unload(self, entry: ModelEntry, why: str) -> None:
        """Close an entry already out of `entries` (under `_mem`)."""
        log.info("unloaded %s (%s)", entry.name, why)
        try:
            entry.close()
        except Exception as e:  # one model failing to close must not stop the others being served
            log.warning("closing %s: %s", entry.name, e)

    def start_janitor(self) -> None:
        self._janitor = threading.Thread(target=self._expire_loop, name="hypura-serve-expire", daemon=True)
        self._janitor.start()

    def _expire_loop(self) -> None:
        while True:
            with self._idle:
                if self._closing:
                    return
                now = time.monotonic()
                due = [e for e in self.idle() if e.expires <= now]
                if not due and not self._retired.any_idle():  # until the next idle one expires, or `release` and loads notify
                    self._idle.wait(min([60.0] + [e.expires - now for e in self.idle()]))
                    continue
            with self._mem:
                self._close_retired()
                with self._lock:
                    due = [e for e in self.idle() if e.expires <= time.monotonic()]
                    for e in due:
                        del self.entries[e.name]
                for e in due:
                    self._unload(e, "keep_alive expired")

    def close(self, wait_s: float = 5.0) -> None:
        with self._idle:
            self._closing = True
            self._idle.notify_all()
        self._loader.shutdown(wait=False, cancel_futures=True)
        if not self._mem.acquire(timeout=wait_s):
            log.warning("stopping while a model still loads: it is closed when its load ends")
        else:
            self._mem.release()
        with self._lock:
            entries, self.entries = list(self.entries.values()) + self._retired.take_all(), {}
        for entry in entries:
            entry.close()


async def _within(future: concurrent.futures.Future, deadline: float, late: str) -> None:
    """`future` awaited until `deadline` (shielded: other requests wait on it too); past it a 503 saying `late`."""
    try:
        await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), deadline - time.monotonic())
    except asyncio.TimeoutError:
        raise ApiError(503, late, None, {"Retry-After": "10"}) from None


def _trim_heap() -> None:
    """Give the C heap's free pages back to the system (glibc's malloc_trim; elsewhere nothing): a copy closed
    while another served leaves its freed buffers between live ones, which glibc keeps (bench/RESULTS.md serve-soak)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim  # the process's own C library
    except (OSError, AttributeError, TypeError):  # not glibc
        return None
