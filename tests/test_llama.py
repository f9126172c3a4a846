"""hypura.Llama against llama_cpp.Llama on the same library: placement hooks change nothing."""

import errno
import functools
import os

import numpy as np
import pytest

import hypura
from hypura.errors import ModelFileError
from hypura.runtime.placement import Placement, Tier

import llama_cpp  # after hypura: it must load hypura's library

TEXT = (
    "The llama is a domesticated South American camelid, widely used as a meat and pack "
    "animal by Andean cultures since the pre-Columbian era. Llamas are social animals and "
    "live with others as a herd. Their wool is soft and contains only a small amount of "
    "lanolin. Llamas can learn simple tasks after a few repetitions. When using a pack, "
    "they can carry about 25 to 30% of their body weight for 8 to 13 km. "
) * 2


def _logits(llm, tokens):
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)], copy=True)


def _greedy(llm, prompt, n=48):
    out = llm.create_completion(prompt, max_tokens=n, temperature=0.0, seed=1)
    return out["choices"][0]["text"]


@pytest.fixture(params=["smollm2", "gemma"], scope="module")
def model_path(request):
    return request.getfixturevalue(f"{request.param}_path")


def _reference(model_path, n_threads):
    """llama_cpp.Llama's logits over TEXT and greedy continuation: the oracle, computed once."""
    llm = llama_cpp.Llama(str(model_path), n_ctx=512, logits_all=True, n_threads=n_threads, verbose=False)
    tokens = llm.tokenize(TEXT.encode())
    assert len(tokens) >= 190
    ref = {"tokens": tokens, "logits": _logits(llm, tokens), "greedy": _greedy(llm, "Once upon a time")}
    llm.close()
    return ref


@pytest.fixture(scope="module")
def reference(model_path, n_threads):
    return _reference(model_path, n_threads)


@pytest.fixture(scope="module")
def reference_smollm2(smollm2_path, n_threads):
    return _reference(smollm2_path, n_threads)


def _load(model_path, n_threads, **kwargs):
    return hypura.Llama(str(model_path), n_ctx=512, logits_all=True, n_threads=n_threads, verbose=False, **kwargs)


def test_same_library_for_both():
    from hypura.bindings.library import lib_path

    assert llama_cpp.llama_cpp._lib._name == str(lib_path())


@pytest.mark.slow
def test_hooks_see_every_tensor_and_logits_are_bitwise_equal(model_path, reference, n_threads):
    seen = []

    def record(info):
        seen.append(info)
        return Placement()

    llm = _load(model_path, n_threads, placement_policy=record)
    try:
        n_tensors = len(llm.header.tensors)
        assert len({i.name for i in seen}) == n_tensors
        by_name = {t.name: t for t in llm.header.tensors}
        for info in seen:  # the hook describes each tensor as the GGUF header does
            t = by_name[info.name]
            assert (info.file_offset, info.nbytes, info.shape) == (t.offset, t.nbytes, t.shape)
            assert info.default_tier == Tier.HOST  # CPU build: llama.cpp keeps all on the host

        assert np.array_equal(_logits(llm, reference["tokens"]), reference["logits"])
        assert _greedy(llm, "Once upon a time") == reference["greedy"]
    finally:
        llm.close()


@pytest.mark.slow
def test_deferred_tensors_filled_by_python_give_the_same_logits(model_path, reference, n_threads):
    """Half the tensors skip llama.cpp's reader and come through the Python fill hook."""
    deferred = []

    def defer_odd_layers(info):
        if info.layer % 2 == 1 or info.layer == -1:
            deferred.append(info.name)
            return Placement(defer=True)
        return Placement()

    llm = _load(model_path, n_threads, placement_policy=defer_odd_layers)
    try:
        assert len(deferred) > 10
        assert np.array_equal(_logits(llm, reference["tokens"]), reference["logits"])
    finally:
        llm.close()


def test_tensor_override_places_as_llama_cpp_does(smollm2_path, n_threads):
    llm = hypura.Llama(str(smollm2_path), n_ctx=256, verbose=False, override_tensor="ffn_(up|down)=CPU")
    try:
        assert llm.placement["blk.0.ffn_up.weight"].tier == Tier.HOST
        assert llm.placement["blk.0.attn_q.weight"].tier == Tier.DEFAULT
        assert llm.tensor_buffer("blk.0.ffn_up.weight").startswith("CPU")  # CPU, CPU_Mapped or CPU_REPACK
        assert llm.tensor_buffer("no.such.tensor") is None
    finally:
        llm.close()


def test_exception_in_policy_surfaces_as_itself(smollm2_path):
    class PolicyBug(RuntimeError):
        pass

    def broken(info):
        if info.layer == 3:
            raise PolicyBug(f"cannot place {info.name}")
        return Placement()

    with pytest.raises(PolicyBug, match="cannot place blk.3"):
        hypura.Llama(str(smollm2_path), n_ctx=256, verbose=False, placement_policy=broken)


def _defer_all(info):
    return Placement(defer=True)


@pytest.mark.slow
def test_deferred_tensors_survive_short_reads(smollm2_path, reference_smollm2, n_threads, monkeypatch):
    """Every weight comes through the disk-tier reader, whose reads come back a few KiB at a time."""
    from hypura.tiers import file_readers
    from hypura.tiers.direct_io import DirectReader

    def trickle(fd, bufs, offset):
        return os.preadv(fd, [bufs[0][: 5 * 4096 + 123]], offset)

    monkeypatch.setattr(file_readers, "DirectReader", functools.partial(DirectReader, pread=trickle, retries=10**9))
    llm = _load(smollm2_path, n_threads, placement_policy=_defer_all)
    try:
        assert np.array_equal(_logits(llm, reference_smollm2["tokens"]), reference_smollm2["logits"])
    finally:
        llm.close()


def test_read_error_while_filling_fails_the_load(smollm2_path, monkeypatch):
    from hypura.tiers import file_readers
    from hypura.tiers.direct_io import DirectReader, DiskReadError

    def failing_disk(fd, bufs, offset):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(file_readers, "DirectReader", functools.partial(DirectReader, pread=failing_disk))
    with pytest.raises(DiskReadError, match="failed after 3 retries: Input/output error"):
        hypura.Llama(str(smollm2_path), n_ctx=256, verbose=False, placement_policy=_defer_all)


def test_unknown_override_buffer_type(smollm2_path):
    with pytest.raises(hypura.errors.HypuraError, match="unknown buffer type 'NPU9'"):
        hypura.Llama(str(smollm2_path), override_tensor="exps=NPU9", verbose=False)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d, src: d / "missing.gguf", "no such file"),
        (lambda d, src: _write(d / "text.gguf", b"hello, not a model"), "not a GGUF file"),
        (lambda d, src: _write(d / "short.gguf", src.read_bytes()[:4096]), "corrupt or truncated"),
        (lambda d, src: _write(d / "cut.gguf", src.read_bytes()[:20_000_000]), "past the end of the file"),
        (lambda d, src: _write(d / "arch.gguf", _with_arch(src.read_bytes(), b"llama", b"zzzzz")), "unsupported model architecture 'zzzzz'"),
    ],
)
def test_bad_model_files_raise_clear_errors(tmp_path, smollm2_path, make, message):
    path = make(tmp_path, smollm2_path)
    with pytest.raises(ModelFileError, match=message):
        hypura.Llama(str(path), verbose=False)


def _write(path, data):
    path.write_bytes(data)
    return path


def _with_arch(data, old, new):
    key = b"general.architecture"
    at = data.index(key) + len(key) + 4 + 8  # value type (u32), string length (u64)
    assert data[at : at + len(old)] == old
    return data[:at] + new + data[at + len(old) :]
