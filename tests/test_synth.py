"""`hypura synth`: files gguf-py reads back, the quant mix llama.cpp's quantizer picks, sizes of
the real models, and tiny models that llama.cpp (through llama-cpp-python) loads and runs."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from hypura.errors import HypuraError
from hypura.synth.blocks import TARGET_STD, BlockPool, _free_bytes
from hypura.modelfile import read_header, read_kv
from hypura.synth.quant_mix import FTYPES, get_ftype, source_type, use_more_bits
from hypura.synth.shapes import SHAPES, get_shape
from hypura.synth.tokenizer import MERGES, TOKEN_TYPE, TOKENS, tokenizer_kv
from hypura.synth.writer import llama3_rope_factors, plan, write_synth

TINY = [name for name in SHAPES if name.startswith("tiny-")]


@pytest.fixture(scope="module")
def llama_cpp():
    """llama-cpp-python over the library in LLAMA_CPP_LIB_PATH (or its own); skip without one."""
    try:
        import llama_cpp
    except Exception as e:  # the shared library is missing or doesn't load
        pytest.skip(f"llama_cpp can't load libllama ({type(e).__name__}: {e}); set LLAMA_CPP_LIB_PATH")
    return llama_cpp


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("synth")
    return {name: write_synth(name, d / f"{name}.gguf").path for name in TINY}


@pytest.fixture(scope="module")
def readers(tiny_files) -> dict[str, gguf.GGUFReader]:
    # GGUFReader indexes every tokenizer array element: seconds per file, so read each once
    return {name: gguf.GGUFReader(path) for name, path in tiny_files.items()}


def _types(path: Path) -> dict[str, Q]:
    return {t.name: t.ggml_type for t in read_header(path).tensors}


# --- the file ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", TINY)
def test_tiny_reads_back(name, tiny_files, readers):
    shape = get_shape(name)
    r = readers[name]
    planned = plan(shape, get_ftype(shape.ftype))
    assert [t.name for t in r.tensors] == [p.spec.name for p in planned]
    for t, p in zip(r.tensors, planned):
        assert Q(t.tensor_type) == p.type, t.name
        assert tuple(int(x) for x in t.shape) == tuple(reversed(p.spec.shape)), t.name  # ggml order
        assert t.n_bytes == p.nbytes and t.data_offset % 32 == 0
    last = r.tensors[-1]
    assert os.path.getsize(tiny_files[name]) == last.data_offset + (last.n_bytes + 31) // 32 * 32

    f = r.fields
    arch = shape.arch
    assert f["general.architecture"].contents() == arch
    assert f["general.file_type"].contents() == get_ftype(shape.ftype).ftype
    assert f[f"{arch}.block_count"].contents() == shape.n_layer
    assert f[f"{arch}.embedding_length"].contents() == shape.n_embd
    assert f[f"{arch}.attention.head_count_kv"].contents() == shape.n_head_kv
    assert len(f[TOKENS].data) == shape.n_vocab
    if shape.n_expert:
        assert f[f"{arch}.expert_count"].contents() == shape.n_expert
        assert f[f"{arch}.expert_used_count"].contents() == shape.n_expert_used
    if shape.head_dim:
        assert f[f"{arch}.attention.key_length"].contents() == shape.head_dim


def test_tensor_shapes_of_each_arch(readers):
    t = {x.name: x for x in readers["tiny-mixtral"].tensors}
    assert list(t["blk.0.ffn_gate_inp.weight"].shape) == [256, 8]  # [n_embd, n_expert], ggml order
    assert list(t["blk.0.ffn_up_exps.weight"].shape) == [256, 512, 8]
    assert list(t["blk.0.ffn_down_exps.weight"].shape) == [512, 256, 8]
    t = {x.name for x in readers["tiny-qwen2"].tensors}
    assert {"blk.0.attn_q.bias", "blk.0.attn_k.bias", "blk.0.attn_v.bias"} <= t
    t = {x.name: x for x in readers["tiny-qwen3moe"].tensors}
    assert list(t["blk.1.attn_q_norm.weight"].shape) == [128]
    assert list(t["blk.1.attn_q.weight"].shape) == [256, 512]  # n_head * head_dim != n_embd
    assert "rope_freqs.weight" in {x.name for x in readers["tiny-llama"].tensors}


@pytest.mark.parametrize("name", ["tiny-qwen3moe", "tiny-mixtral"])
def test_weights_are_finite_and_small(name, readers):
    for t in readers[name].tensors:
        w = dequantize(t.data, Q(t.tensor_type)).astype(np.float32)
        assert np.isfinite(w).all(), t.name
        if "_norm" in t.name:
            assert (w == 1.0).all(), t.name
        elif Q(t.tensor_type) != Q.F32:
            assert abs(float(w.mean())) < 0.003 and 0.5 * TARGET_STD < float(w.std()) < 2 * TARGET_STD, t.name


def test_seed_decides_the_bytes(tmp_path):
    a = write_synth("tiny-mixtral", tmp_path / "a.gguf", seed=7).path.read_bytes()
    b = write_synth("tiny-mixtral", tmp_path / "b.gguf", seed=7).path.read_bytes()
    c = write_synth("tiny-mixtral", tmp_path / "c.gguf", seed=8).path.read_bytes()
    assert a == b and a != c and len(a) == len(c)


def test_block_pool_chunks_are_bounded_slices():
    rng = np.random.default_rng(0)
    pool = BlockPool(Q.Q4_K, rng, pool_bytes=144 * 100)
    chunks = list(pool.chunks(144 * 250, rng))
    assert sum(len(c) for c in chunks) == 144 * 250
    assert all(len(c) <= 144 * 100 for c in chunks)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.MXFP4, Q.F16, Q.F32])
def test_two_slices_at_one_offset_repeat_no_row(qtype):
    """The same pool blocks written twice differ in every block and keep their fp16 scales (MXFP4: exponents): a
    repeated output row would tie two tokens' logits exactly, and greedy would hang on a front end's tie-break."""
    pool = BlockPool(qtype, np.random.default_rng(0), pool_bytes=64 * 1024)
    same = pool.data[:pool.n_blocks * pool.block_bytes]
    row = pool.block_bytes * (64 if qtype in (Q.F16, Q.F32) else 1)  # a float's block is one weight: rows of 64
    a, b = (pool._own(same, np.random.default_rng(seed)).reshape(-1, row) for seed in (1, 2))
    assert not (a == b).all(axis=1).any()
    if qtype not in (Q.F16, Q.F32):
        kept = _free_bytes(qtype, pool.block_bytes) == 0
        assert (a[:, kept] == same.reshape(-1, row)[:, kept]).all()


def test_llama3_rope_factors():
    f = llama3_rope_factors(get_shape("llama3.1-8b"))
    assert f.shape == (64,) and f[0] == 1.0 and f[-1] == 8.0 and (np.diff(f) >= 0).all()


def test_tokenizer_resized():
    kv = {k.key: k.value for k in tokenizer_kv(152064)}
    assert len(kv[TOKENS]) == len(kv[TOKEN_TYPE]) == 152064
    assert kv[TOKENS][-1] == "[PAD152063]" and kv[TOKEN_TYPE][-1] == gguf.TokenType.UNUSED
    kv = {k.key: k.value for k in tokenizer_kv(32000)}
    assert len(kv[TOKENS]) == 32000 and kv[TOKENS][:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    kept = set(kv[TOKENS])
    assert all(a in kept and b in kept and a + b in kept for a, b in (m.split(" ", 1) for m in kv[MERGES]))


# --- quant mix and sizes ------------------------------------------------------------------

def test_quant_mix_truncated_70b(tmp_path):
    """llama3.3-70b --layers 2: use_more_bits over 2 blocks picks block 1 for Q6_K."""
    t = _types(write_synth("llama3.3-70b", tmp_path / "m.gguf", layers=2, sparse=True).path)
    assert t["output.weight"] == Q.Q6_K and t["token_embd.weight"] == Q.Q4_K
    assert t["blk.0.attn_v.weight"] == Q.Q4_K and t["blk.1.attn_v.weight"] == Q.Q6_K
    assert t["blk.0.ffn_down.weight"] == Q.Q4_K and t["blk.1.ffn_down.weight"] == Q.Q6_K
    assert t["blk.1.attn_q.weight"] == t["blk.1.ffn_up.weight"] == Q.Q4_K
    assert t["blk.1.attn_norm.weight"] == t["rope_freqs.weight"] == Q.F32


def test_quant_mix_full_shapes():
    q4 = get_ftype("q4_k_m")
    t = {p.spec.name: p.type for p in plan(get_shape("llama3.3-70b"), q4)}
    assert [t[f"blk.{i}.attn_v.weight"] for i in (0, 9, 10, 11, 12, 79)] == \
        [Q.Q6_K, Q.Q6_K, Q.Q5_K, Q.Q5_K, Q.Q6_K, Q.Q6_K]  # 70B: attn_v never below Q5_K
    assert [t[f"blk.{i}.ffn_down.weight"] for i in (9, 10, 12)] == [Q.Q6_K, Q.Q4_K, Q.Q6_K]
    t = {p.spec.name: p.type for p in plan(get_shape("mixtral-8x7b"), q4)}
    assert t["blk.5.attn_k.weight"] == t["blk.5.attn_v.weight"] == Q.Q8_0  # 8 experts
    assert t["blk.5.attn_output.weight"] == Q.Q5_K and t["blk.5.ffn_gate_inp.weight"] == Q.F32
    assert t["blk.0.ffn_down_exps.weight"] == Q.Q6_K and t["blk.5.ffn_down_exps.weight"] == Q.Q4_K
    t = {p.spec.name: p.type for p in plan(get_shape("tiny-qwen3moe"), get_ftype("q5_k_m"))}
    # expert width 128 is not a multiple of 256: Q5_K falls back to Q5_1, Q6_K (block 1) to Q8_0
    assert t["blk.0.ffn_down_exps.weight"] == Q.Q5_1 and t["blk.1.ffn_down_exps.weight"] == Q.Q8_0
    assert t["blk.0.attn_q.weight"] == Q.Q5_K
    assert all(p.type == Q.F16 or p.type == Q.F32 for p in plan(get_shape("qwen2.5-14b"), get_ftype("f16")))
    assert use_more_bits(0, 48) and not use_more_bits(6, 48) and use_more_bits(8, 48)


# Published GGUFs of the same llama.cpp mixes (GiB), e.g. bartowski's Llama-3.3-70B-Instruct
# Q4_K_M 42.5 GB; Mixtral Q5_K_M files from older llama.cpp are ~1 GB smaller (fewer Q6_K ffn_down).
SIZES_GIB = {
    ("llama3.3-70b", "q4_k_m"): (39.4, 39.8),
    ("llama3.1-8b", "q4_k_m"): (4.5, 4.65),
    ("qwen2.5-14b", "q4_k_m"): (8.3, 8.45),
    ("mixtral-8x7b", "q5_k_m"): (30.0, 31.2),
    ("qwen3-30b-a3b", "q4_k_m"): (17.0, 17.6),
}


@pytest.mark.parametrize("name,ftype", list(SIZES_GIB))
def test_sparse_full_size_is_instant(name, ftype, tmp_path):
    t0 = time.perf_counter()
    r = write_synth(name, tmp_path / "s.gguf", ftype=ftype, sparse=True)
    assert time.perf_counter() - t0 < 3.0  # ~0.2 s: no tensor data is written
    lo, hi = SIZES_GIB[name, ftype]
    assert lo < os.path.getsize(r.path) / 2**30 < hi
    assert os.stat(r.path).st_blocks * 512 < 64 << 20  # a hole, not 40 GB of zeros
    h = read_header(r.path)
    assert [t.ggml_type for t in h.tensors] == [p.type for p in r.tensors] and h.data_offset == r.data_offset
    assert h.tensors[-1].offset + r.tensors[-1].nbytes <= r.file_bytes
    assert len(next(kv.value for kv in read_kv(r.path) if kv.key == TOKENS)) == get_shape(name).n_vocab


# --- llama.cpp as the oracle ----------------------------------------------------------------

def _llama_quant_types(llama_cpp, shape, ftype) -> list[Q]:
    """Tensor types from llama.cpp's own chooser, llama_quant_compute_types (src/llama-ext.h, a
    C++ staging API: reached by its mangled names) on tensors with no data."""
    lib = llama_cpp.llama_cpp._lib
    try:
        base = ctypes.CDLL(os.path.join(os.path.dirname(lib._name), "libggml-base.so"))
        model_from_metadata = lib["_Z31llama_quant_model_from_metadataPK22llama_quant_model_desc"]
        quant_init = lib["_Z16llama_quant_initPK11llama_modelPK27llama_model_quantize_params"]
        compute_types = lib["_Z25llama_quant_compute_typesP19quantize_state_impl11llama_ftypePP11ggml_tensorP9ggml_typem"]
        quant_free = lib["_Z16llama_quant_freeP19quantize_state_impl"]
    except (OSError, AttributeError) as e:
        pytest.skip(f"this libllama has no llama_quant_* staging API: {e}")

    class InitParams(ctypes.Structure):
        _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]

    class Desc(ctypes.Structure):
        _fields_ = [("architecture", ctypes.c_char_p)] + [(n, ctypes.c_uint32) for n in (
            "n_embd", "n_ff", "n_layer", "n_head", "n_head_kv", "n_expert", "n_embd_head_k", "n_embd_head_v")]

    vp = ctypes.c_void_p
    base.ggml_init.argtypes, base.ggml_init.restype = [InitParams], vp
    base.ggml_tensor_overhead.restype = ctypes.c_size_t
    base.ggml_new_tensor.argtypes = [vp, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int64)]
    base.ggml_new_tensor.restype = vp
    base.ggml_set_name.argtypes, base.ggml_set_name.restype = [vp, ctypes.c_char_p], vp
    base.ggml_free.argtypes = [vp]
    model_from_metadata.argtypes, model_from_metadata.restype = [ctypes.POINTER(Desc)], vp
    quant_init.argtypes = [vp, ctypes.POINTER(llama_cpp.llama_model_quantize_params)]
    quant_init.restype = vp
    compute_types.argtypes = [vp, ctypes.c_int, ctypes.POINTER(vp), ctypes.POINTER(ctypes.c_int), ctypes.c_size_t]
    quant_free.argtypes = [vp]

    specs = [p.spec for p in plan(shape, ftype)]
    ctx = base.ggml_init(InitParams(base.ggml_tensor_overhead() * (len(specs) + 1), None, True))
    tensors = (vp * len(specs))()
    for i, s in enumerate(specs):
        t = base.ggml_new_tensor(ctx, int(source_type(s)), len(s.shape), (ctypes.c_int64 * 4)(*reversed(s.shape)))
        base.ggml_set_name(t, s.name.encode())
        tensors[i] = t
    ff = shape.expert_ff if shape.n_expert else shape.n_ff
    desc = Desc(shape.arch.encode(), shape.n_embd, ff, shape.n_layer, shape.n_head, shape.n_head_kv,
                shape.n_expert, shape.n_embd_head, shape.n_embd_head)
    model = model_from_metadata(ctypes.byref(desc))
    params = llama_cpp.llama_model_quantize_default_params()
    qs = quant_init(model, ctypes.byref(params))
    out = (ctypes.c_int * len(specs))()
    compute_types(qs, int(ftype.ftype), tensors, out, len(specs))
    quant_free(qs)
    llama_cpp.llama_model_free(ctypes.c_void_p(model))
    base.ggml_free(ctx)
    return [Q(x) for x in out]


@pytest.mark.parametrize("name", list(SHAPES))
def test_quant_mix_matches_llama_cpp(name, llama_cpp):
    full = get_shape(name)
    for ftype in FTYPES.values():
        for shape in (full, full.truncated(1), full.truncated(min(3, full.n_layer))):
            ours = [p.type for p in plan(shape, ftype)]
            assert ours == _llama_quant_types(llama_cpp, shape, ftype), (name, ftype.name, shape.n_layer)


@pytest.mark.parametrize("name", TINY)
def test_llama_model_quantize_agrees(name, llama_cpp, tmp_path):
    """Quantize an f16 synth with llama.cpp itself; its Q4_K_M types are ours (small vocab: fast)."""
    shape = dataclasses.replace(get_shape(name), n_vocab=1024)
    src = write_synth(shape, tmp_path / "f16.gguf", ftype="f16").path
    dst = tmp_path / "q.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = int(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    params.nthread = 2
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) == 0
    assert _types(dst) == {p.spec.name: p.type for p in plan(shape, get_ftype("q4_k_m"))}


@pytest.mark.parametrize("name", TINY)
def test_tiny_loads_and_generates(name, tiny_files, llama_cpp):
    llm = llama_cpp.Llama(str(tiny_files[name]), n_ctx=64, n_threads=2, logits_all=True, verbose=False)
    prompt = llm.tokenize(b"<|im_start|>user\nHello<|im_end|>\n", add_bos=False, special=True)
    assert prompt[0] == 1  # <|im_start|>: the SmolLM2 tokenizer is in the file
    out = []
    for tok in llm.generate(prompt, temp=0.0):
        out.append(tok)
        if len(out) == 4:
            break
    assert len(out) == 4 and all(0 <= t < get_shape(name).n_vocab for t in out)
    scores = llm.scores[: llm.n_tokens]
    assert np.isfinite(scores).all() and 0 < np.abs(scores).max() < 100
    assert isinstance(llm.detokenize(out), bytes)


def test_padded_vocab_loads(llama_cpp, tmp_path):
    """Real vocabularies are larger than the default model's: [PADn] tokens fill the gap."""
    shape = dataclasses.replace(get_shape("tiny-qwen2"), n_vocab=49152 + 256)
    path = write_synth(shape, tmp_path / "pad.gguf").path
    llm = llama_cpp.Llama(str(path), n_ctx=64, n_threads=2, verbose=False)
    assert llm.n_vocab() == 49408 and llm.detokenize([49407]) == b""
    assert len(llm.create_completion("Hello", max_tokens=3, temperature=0.0)["choices"]) == 1


# --- user errors ----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,match", [
    (dict(shape="llama9-1t"), "unknown shape 'llama9-1t'"),
    (dict(shape="tiny-llama", layers=0), "--layers must be between 1 and 4"),
    (dict(shape="tiny-llama", layers=5), "--layers must be between 1 and 4"),
    (dict(shape="tiny-llama", ftype="q3_k_s"), "unknown --ftype 'q3_k_s'"),
])
def test_bad_input(kwargs, match, tmp_path):
    with pytest.raises(HypuraError, match=match):
        write_synth(out=tmp_path / "x.gguf", **kwargs)
    assert not list(tmp_path.iterdir())


def test_unwritable_path(tmp_path):
    with pytest.raises(HypuraError, match="does not exist"):
        write_synth("tiny-llama", tmp_path / "missing" / "x.gguf")
    (tmp_path / "ro").mkdir(mode=0o500)
    if os.access(tmp_path / "ro", os.W_OK):  # root ignores permissions
        return
    with pytest.raises(HypuraError, match="cannot write"):
        write_synth("tiny-llama", tmp_path / "ro" / "x.gguf")


def test_cli(tmp_path):
    from click.testing import CliRunner

    from hypura.cli.main import cli

    run = CliRunner().invoke
    r = run(cli, ["synth", "tiny-qwen2", str(tmp_path / "m.gguf"), "--layers", "1", "--ftype", "Q8_0", "--seed", "3"])
    assert r.exit_code == 0, r.output
    assert "tiny-qwen2 q8_0, 1 layers" in r.output and "MB/s" in r.output
    assert set(_types(tmp_path / "m.gguf").values()) == {Q.Q8_0, Q.F32}
    r = run(cli, ["synth", "llama3.3-70b", str(tmp_path / "s.gguf"), "--sparse"])
    assert r.exit_code == 0 and "39.60 GiB (sparse: header only, not runnable)" in r.output


def test_cli_error_is_one_line(tmp_path):
    code = "from hypura.cli.main import main; main()"
    args = ["synth", "tiny-llama", str(tmp_path / "x.gguf"), "--layers", "0"]
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == ["error: --layers must be between 1 and 4 for tiny-llama, got 0"]


def test_tokenizer_from_another_gguf(tmp_path):
    """A machine without the default model copies the tokenizer of a GGUF it has (padded)."""
    src = write_synth("tiny-qwen2", tmp_path / "src.gguf").path
    out = write_synth("tiny-llama", tmp_path / "out.gguf", tokenizer_from=src).path
    src_tokens = next(kv.value for kv in read_kv(src) if kv.key == TOKENS)
    tokens = next(kv.value for kv in read_kv(out) if kv.key == TOKENS)
    assert len(src_tokens) < len(tokens) == get_shape("tiny-llama").n_vocab
    assert tokens[: len(src_tokens)] == src_tokens


def test_synth_and_inspect_need_no_llama_cpp_library(tmp_path):
    """A fresh GPU machine makes its models while llama.cpp builds: `hypura synth` and `hypura inspect` import no
    command that loads the library."""
    env = {**os.environ, "HYPURA_LIB_DIR": str(tmp_path / "not-built"), "LLAMA_CPP_LIB_PATH": ""}
    code = "from hypura.cli.main import main; main()"
    out = tmp_path / "x.gguf"
    r = subprocess.run([sys.executable, "-c", code, "synth", "tiny-llama", str(out)], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0 and out.is_file(), r.stderr
    r = subprocess.run([sys.executable, "-c", code, "inspect", str(out), "--profile", "h200-design", "--gpu-mem", "0",
                        "--ram", "1GiB"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and "predict" in r.stdout, r.stderr
