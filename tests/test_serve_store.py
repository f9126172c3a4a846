"""`hypura serve` with no -m over a fake Ollama store (tests/ollama_store.py): every model offered
(/api/tags with Ollama's digests), loaded on its first request, kept for keep_alive, unloaded by
keep_alive 0 or for another model's memory; a loaded model served while another loads; broken entries
one line each while the others serve. Engines are the route tests' fakes except where marked real."""

from __future__ import annotations

import hashlib
import os
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from hypura.errors import HypuraError  # noqa: E402
from hypura.plan.auto import resident_need  # noqa: E402
from hypura.plan.decision import unified_memory  # noqa: E402
from hypura.modelfile import read_header  # noqa: E402
from hypura.plan import knobs  # noqa: E402
from hypura.profile import free  # noqa: E402
from hypura.serve.server import Server  # noqa: E402
from hypura.serve.settings import ServeSettings  # noqa: E402
from hypura.store import resolve_model  # noqa: E402
from ollama_store import fake_store  # noqa: E402
from serve_fakes import FakeEngine, FakeLlama  # noqa: E402
from serve_helpers import ONE_THREAD  # noqa: E402

PARALLEL, N_CTX = 2, 256


@pytest.fixture()
def store(tmp_path, monkeypatch, smollm2_path, gemma_path):
    root = fake_store(tmp_path / "ollama", smollm2_path, gemma_path)
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HYPURA_MODELS", raising=False)
    monkeypatch.setattr(free, "OVERRIDE", "gpu=0,ram=64GiB")  # room for every model unless a test says otherwise
    return root


class Loads:
    """An engine starter of fakes that records each load, and may hold one model's load until released."""

    def __init__(self):
        self.started, self.engines, self.hold, self.fail, self.free, self.fits = [], {}, {}, set(), {}, {}
        self.token_s = 0.002

    def __call__(self, path, settings):
        self.started.append(path)
        if path.name in self.fail:
            raise HypuraError("not enough free memory to run it, even streaming from disk")
        gate = self.hold.get(path.name)
        if gate is not None:
            assert gate.wait(20), "a held load was never released"
        fit = settings.llama_kwargs.get("fit")
        self.free[path.name] = fit.free if fit is not None else None  # what the load is planned within
        self.fits[path.name] = fit
        engine = FakeEngine(n_ctx=settings.n_ctx, token_s=self.token_s)
        self.engines.setdefault(path.name, []).append(engine)
        return FakeLlama(path), engine


def serve(loads, **settings) -> Server:
    settings = {"port": 0, "parallel": PARALLEL, "n_ctx": N_CTX, **settings}
    return Server(ServeSettings(**settings), engine_starter=loads, log_level="warning").start()


@pytest.fixture()
def loads():
    return Loads()


def _ready(server):
    deadline = time.monotonic() + 10
    while not server.state.ready:
        assert time.monotonic() < deadline, server.state.error
        time.sleep(0.01)
    return httpx.Client(base_url=server.url, timeout=30)


def _generate(c, model, **body):
    return c.post("/api/generate", json={"model": model, "prompt": "Hi", "stream": False, "raw": True,
                                         "options": {"num_predict": 3}, **body})


def _loaded(c) -> list[str]:
    return [m["name"] for m in c.get("/api/ps").json()["models"]]


def _until(check, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_tags_offer_the_store_and_nothing_loads(store, loads):
    server = serve(loads)
    try:
        with _ready(server) as c:
            tags = {m["name"]: m for m in c.get("/api/tags").json()["models"]}
            assert set(tags) == {"smol:latest", "someone/smol:tiny", "gemma3:270m"}  # broken ones left out
            manifest = store / "manifests/registry.ollama.ai/library/gemma3/270m"
            assert tags["gemma3:270m"]["digest"] == hashlib.sha256(manifest.read_bytes()).hexdigest()
            assert tags["gemma3:270m"]["details"]["quantization_level"] == "Q4_K_M"
            assert tags["smol:latest"]["details"]["family"] == "llama"
            assert [m["id"] for m in c.get("/v1/models").json()["data"]] == list(tags)
            show = c.post("/api/show", json={"model": "smol"}).json()
            assert "temperature 0.25" in show["parameters"] and 'stop "User:"' in show["parameters"]
            assert _loaded(c) == [] and loads.started == []
    finally:
        server.stop()


def test_first_request_loads_with_the_params_layer(store, loads):
    server = serve(loads)
    try:
        with _ready(server) as c:
            r = _generate(c, "smol")
            assert r.status_code == 200 and r.json()["done_reason"] == "length"
            ps = c.get("/api/ps").json()["models"]
            assert [m["name"] for m in ps] == ["smol:latest"] and ps[0]["hypura"]["plan"]
            assert ps[0]["expires_at"] and ps[0]["size_vram"] == 0
            request = loads.engines[resolve_model("smol").path.name][0].submitted[0]
            assert request.params.temperature == 0.25 and "User:" in request.params.stop  # Ollama's params layer
            assert _generate(c, "library/smol:latest").status_code == 200
            assert _generate(c, "someone/smol").status_code == 404  # :latest, as Ollama reads it: not :tiny
            assert len(loads.started) == 1  # loaded once, then served as loaded
    finally:
        server.stop()


def test_keep_alive_expires_and_zero_unloads(store, loads):
    server = serve(loads)
    try:
        with _ready(server) as c:
            assert _generate(c, "smol", keep_alive="300ms").status_code == 200
            assert _loaded(c) == ["smol:latest"]
            _until(lambda: _loaded(c) == [], timeout=5)
            assert loads.engines[resolve_model("smol").path.name][0].closed
            r = _generate(c, "gemma3:270m", keep_alive=-1)
            assert r.status_code == 200, r.text
            r = c.post("/api/generate", json={"model": "gemma3:270m", "keep_alive": 0})
            assert r.status_code == 200 and r.json()["done"] and r.json()["done_reason"] == "unload"
            assert _loaded(c) == []
            assert _generate(c, "smol", keep_alive=0).status_code == 200  # unloaded once answered
            _until(lambda: _loaded(c) == [], timeout=5)
            r = c.post("/api/chat", json={"model": "gemma3:270m", "keep_alive": "bad"})
            assert r.status_code == 400 and "keep_alive" in r.json()["error"]
    finally:
        server.stop()


def _need(path) -> tuple[int, int]:
    """(GPU, RAM) bytes as the registry counts them (on a GPU machine the tests pin gpu=0: nothing fits there)."""
    on_gpu = free.totals().gpu is not None  # a GPU build (its size, not what is free)
    return resident_need(read_header(path), PARALLEL * N_CTX, knobs.N_UBATCH, on_gpu, on_gpu and unified_memory())


def _pin_room_for_one(monkeypatch, a, b) -> int:
    """Free memory that holds either model alone, never both (RAM; the GPU pinned at 0 where there is one)."""
    ram = knobs.RAM_MARGIN + max(_need(a)[1], _need(b)[1]) + min(_need(a)[1], _need(b)[1]) // 2
    monkeypatch.setattr(free, "OVERRIDE", f"gpu=0,ram={ram}")  # both parts named: nothing measured
    return ram


def test_two_models_one_at_a_time(store, loads, monkeypatch, caplog):
    smol, gemma = resolve_model("smol").path, resolve_model("gemma3:270m").path
    _pin_room_for_one(monkeypatch, smol, gemma)
    server = serve(loads)
    try:
        with _ready(server) as c, caplog.at_level("INFO", logger="hypura.serve"):
            assert _generate(c, "smol").status_code == 200
            assert _generate(c, "gemma3:270m").status_code == 200
            assert _loaded(c) == ["gemma3:270m"]
            assert loads.engines[smol.name][0].closed
            assert "unloaded smol:latest (to make room for gemma3:270m)" in caplog.text
            assert "loading gemma3:270m: alone; unloaded smol:latest for it" in caplog.text
    finally:
        server.stop()


def test_two_models_beside_each_other_below_the_margin_as_a_load_alone_holds_them(store, loads, monkeypatch, caplog):
    """Free memory that holds both only below the default path's RAM margin: the second loads beside the first,
    as a direct load holds it in what the first leaves (llama.cpp's placement, plan/auto.py fits_in_order),
    instead of unloading the first for a margin no unloading can keep."""
    from dataclasses import replace

    from hypura.plan.decision import Ask, decide
    from hypura.profile.measure import planning_profile

    if free.totals().gpu is not None:
        pytest.skip("with a GPU the room keeps the margins alone (serve/models/room.py)")
    smol, gemma = resolve_model("smol").path, resolve_model("gemma3:270m").path
    ram = _need(smol)[1] + _need(gemma)[1] + (16 << 20)
    assert ram < knobs.RAM_MARGIN
    monkeypatch.setattr(free, "OVERRIDE", f"gpu=0,ram={ram}")
    server = serve(loads)
    try:
        with _ready(server) as c, caplog.at_level("INFO", logger="hypura.serve"):
            assert _generate(c, "smol").status_code == 200
            assert _generate(c, "gemma3:270m").status_code == 200
            assert sorted(_loaded(c)) == ["gemma3:270m", "smol:latest"]
            assert not loads.engines[smol.name][0].closed
            assert "loading gemma3:270m: beside smol:latest;" in caplog.text and "below the RAM margin" in caplog.text
    finally:
        server.stop()
    fit = loads.fits[gemma.name]
    assert fit.free.ram == ram - _need(smol)[1]
    # the load alone in that memory: llama.cpp's placement, below the margin, as the server holds it
    alone = replace(fit, ram_margin=knobs.RAM_MARGIN, say=None, measure_profile=False)
    d = decide(read_header(gemma), Ask(n_ctx=PARALLEL * N_CTX, fit=alone), alone.free,
               lambda: planning_profile(measure=False))
    assert d.plan is None and d.fits and "below the 2.0 GiB RAM margin" in d.line
    # less than both hold: the first is unloaded for the second, as before
    monkeypatch.setattr(free, "OVERRIDE", f"gpu=0,ram={ram - min(_need(smol)[1], _need(gemma)[1])}")
    assert _loaded_after(loads, "smol", "gemma3:270m") == ["gemma3:270m"]


def test_planned_within_what_a_busy_model_leaves(store, loads, monkeypatch, caplog):
    smol, gemma = resolve_model("smol").path, resolve_model("gemma3:270m").path
    pinned = _pin_room_for_one(monkeypatch, smol, gemma)
    loads.token_s = 0.05  # smol's request below runs ~2 s: busy while gemma loads
    server = serve(loads)
    try:
        with _ready(server) as c, caplog.at_level("INFO", logger="hypura.serve"):
            busy = threading.Thread(target=lambda: _generate(httpx.Client(base_url=server.url, timeout=30), "smol",
                                                             options={"num_predict": 40}))
            busy.start()
            _until(lambda: _loaded(c) == ["smol:latest"])
            assert _generate(c, "gemma3:270m").status_code == 200
            busy.join(10)
            assert loads.free[gemma.name].ram == pinned - _need(smol)[1]  # what smol, staying, leaves
            assert "loading gemma3:270m: beside smol:latest;" in caplog.text
            assert sorted(_loaded(c)) == ["gemma3:270m", "smol:latest"]
    finally:
        server.stop()


def test_a_model_whose_file_changed_is_loaded_again(store, loads, caplog):
    """A loaded model's file deleted: the loaded copy serves on. Replaced (a new inode): its next request loads it
    again and the old copy is closed; a file that no longer loads answers 500 naming it while the other model is
    served; restored, it loads again."""
    smol = resolve_model("smol").path
    good = smol.read_bytes()

    def replace(data: bytes) -> None:  # a new inode: the blob's hard link to the test model is left alone
        fresh = smol.with_name(smol.name + ".new")
        fresh.write_bytes(data)
        os.replace(fresh, smol)

    server = serve(loads)
    try:
        with _ready(server) as c, caplog.at_level("INFO", logger="hypura.serve"):
            assert _generate(c, "smol").status_code == 200
            smol.unlink()
            assert _generate(c, "smol").status_code == 200 and loads.started.count(smol) == 1
            replace(good)
            assert _generate(c, "smol").status_code == 200
            assert loads.started.count(smol) == 2 and loads.engines[smol.name][0].closed
            assert f"{smol} changed since it was loaded" in caplog.text
            replace(good[: len(good) // 2])
            r = _generate(c, "smol")
            assert r.status_code == 500 and str(smol) in r.json()["error"], r.text
            assert _generate(c, "gemma3:270m").status_code == 200
            replace(good)
            assert _generate(c, "smol").status_code == 200
            assert sorted(_loaded(c)) == ["gemma3:270m", "smol:latest"]
    finally:
        server.stop()


def _loaded_after(loads, *names, **settings) -> list[str]:
    """The models loaded once a request for each of `names` was answered, in turn, by a fresh server."""
    server = serve(loads, **settings)
    try:
        with _ready(server) as c:
            for name in names:
                assert _generate(c, name).status_code == 200
            return _loaded(c)
    finally:
        server.stop()


def test_max_loaded(store, loads):
    assert _loaded_after(loads, "smol", "someone/smol:tiny", max_loaded=1) == ["someone/smol:tiny"]


def test_loaded_model_served_while_another_loads(store, loads):
    gemma = resolve_model("gemma3:270m").path
    loads.hold[gemma.name] = threading.Event()
    server = serve(loads)
    try:
        with _ready(server) as c:
            assert _generate(c, "smol").status_code == 200
            waiting = {}
            t = threading.Thread(target=lambda: waiting.setdefault("r", _generate(httpx.Client(
                base_url=server.url, timeout=30), "gemma3:270m")))
            t.start()
            _until(lambda: gemma in loads.started)
            for _ in range(3):  # the load is under way and held: smol answers regardless
                started = time.monotonic()
                assert _generate(c, "smol").status_code == 200
                assert time.monotonic() - started < 2
            assert "r" not in waiting
            loads.hold[gemma.name].set()
            t.join(10)
            assert waiting["r"].status_code == 200
            assert sorted(_loaded(c)) == ["gemma3:270m", "smol:latest"]
    finally:
        server.stop()


def test_stop_while_loading_is_clean(store, loads):
    gemma = resolve_model("gemma3:270m").path
    loads.hold[gemma.name] = threading.Event()
    server = serve(loads)
    with _ready(server):
        t = threading.Thread(target=lambda: _generate(httpx.Client(base_url=server.url, timeout=30), "gemma3:270m"))
        t.start()
        _until(lambda: gemma in loads.started)
    threading.Timer(0.5, loads.hold[gemma.name].set).start()  # the load ends while the server stops
    server.stop()
    t.join(10)
    _until(lambda: all(e.closed for e in loads.engines.get(gemma.name, [])) and gemma.name in loads.engines)


@pytest.mark.parametrize("name, why", [("broken:json", "not a JSON manifest"), ("broken:missing", "missing"),
                                       ("broken:notgguf", "not a GGUF file")])
def test_broken_entries_fail_alone(store, loads, name, why):
    server = serve(loads)
    try:
        with _ready(server) as c:
            r = _generate(c, name)
            assert r.status_code == 500 and why in r.json()["error"] and "\n" not in r.json()["error"]
            assert _generate(c, "smol").status_code == 200
            assert c.post("/api/generate", json={"model": "nothing", "prompt": "x"}).status_code == 404
    finally:
        server.stop()


def test_a_failed_load_is_one_line_and_the_others_serve(store, loads):
    loads.fail.add(resolve_model("gemma3:270m").path.name)
    server = serve(loads)
    try:
        with _ready(server) as c:
            r = _generate(c, "gemma3:270m")
            assert r.status_code == 500 and r.json()["error"] == ("model 'gemma3:270m' failed to load: not enough "
                                                                  "free memory to run it, even streaming from disk")
            assert _generate(c, "smol").status_code == 200 and _loaded(c) == ["smol:latest"]
    finally:
        server.stop()


def test_serve_m_name_loads_at_start(store, loads):
    server = serve(loads, models=(resolve_model("someone/smol:tiny"),))
    try:
        with _ready(server) as c:
            assert _loaded(c) == ["someone/smol:tiny"] and len(loads.started) == 1
            assert [m["name"] for m in c.get("/api/tags").json()["models"]] == ["someone/smol:tiny"]
            digest = hashlib.sha256((store / "manifests/registry.ollama.ai/someone/smol/tiny").read_bytes()).hexdigest()
            assert c.get("/api/ps").json()["models"][0]["digest"] == digest
            assert _generate(c, "someone/smol:tiny", keep_alive=0).status_code == 200
            assert _loaded(c) == ["someone/smol:tiny"]  # loaded at start: kept
    finally:
        server.stop()


def test_real_engine_on_demand(store):
    server = Server(ServeSettings(port=0, parallel=2, n_ctx=256, llama_kwargs=ONE_THREAD), log_level="warning").start()
    try:
        with _ready(server) as c:
            r = c.post("/api/chat", json={"model": "someone/smol:tiny", "stream": False, "options": {"num_predict": 4},
                                          "messages": [{"role": "user", "content": "Hello"}]}, timeout=120)
            assert r.status_code == 200 and r.json()["eval_count"] == 4
            ps = c.get("/api/ps").json()["models"]
            assert ps[0]["name"] == "someone/smol:tiny" and "fits" in ps[0]["hypura"]["plan"]
            r = c.post("/api/chat", json={"model": "someone/smol:tiny", "keep_alive": 0})
            assert r.json()["done_reason"] == "unload" and _loaded(c) == []  # the real engine and model closed
            r = c.post("/v1/completions", json={"model": "someone/smol:tiny", "prompt": "Hi", "max_tokens": 2},
                       timeout=120)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2  # loaded again
    finally:
        server.stop()


def test_room_takes_only_the_models_still_idle():
    """make_room reads the registry's loaded and idle models, then takes those it chose that no request leased
    meanwhile (Registry.loaded, Registry.take_idle: the registry's lock stays its own)."""
    from types import SimpleNamespace

    from hypura.serve.models.entry import ModelEntry
    from hypura.serve.models.registry import Registry

    def entry(name: str, expires: float) -> ModelEntry:
        closed = SimpleNamespace(close=lambda: None)
        return ModelEntry(info=SimpleNamespace(name=name), path=None, engine=closed, llm=closed, template=None,
                          template_error=None, n_ctx=N_CTX, n_vocab=0, loaded_at=None, load_s=0.0, size_vram=0,
                          pinned=False, expires=expires)

    registry = Registry()
    older, newer, kept = entry("older", 1.0), entry("newer", 2.0), entry("kept", 0.5)
    kept.pinned = True
    registry.entries = {e.name: e for e in (newer, kept, older)}
    loaded, idle = registry.loaded()
    assert loaded == [newer, kept, older] and idle == [older, newer]  # least recently used first, never a pinned one
    newer.leases = 1  # a request leased it while the room was chosen
    assert registry.take_idle(idle) == [older] and list(registry.entries) == ["newer", "kept"]
    registry.close()
