"""The large MoE shapes of `hypura synth`: header-only files whose hparams and tensor shapes are
the published models', and small layer subsets that vanilla llama.cpp loads and runs."""

from __future__ import annotations

import gguf
import pytest
from gguf import GGMLQuantizationType as Q

from hypura.modelfile import read_header, read_kv
from hypura.synth.writer import write_synth
from hypura.units import model_units


def _kv(path) -> dict[str, object]:
    return {kv.key: kv.value for kv in read_kv(path)}


def _shapes(path) -> dict[str, tuple[int, ...]]:
    # numpy order (outermost first), as layout.py writes them
    return {t.name: tuple(reversed(t.shape)) for t in read_header(path).tensors}


def test_qwen3_235b_header(tmp_path):
    p = write_synth("qwen3-235b-a22b", tmp_path / "q.gguf", sparse=True).path
    kv, sh = _kv(p), _shapes(p)
    assert kv["general.architecture"] == "qwen3moe" and kv["qwen3moe.block_count"] == 94
    assert (kv["qwen3moe.embedding_length"], kv["qwen3moe.expert_feed_forward_length"]) == (4096, 1536)
    assert (kv["qwen3moe.expert_count"], kv["qwen3moe.expert_used_count"]) == (128, 8)
    assert (kv["qwen3moe.attention.head_count"], kv["qwen3moe.attention.head_count_kv"]) == (64, 4)
    assert kv["qwen3moe.attention.key_length"] == 128
    assert sh["token_embd.weight"] == (151936, 4096)
    assert sh["blk.93.attn_q.weight"] == (64 * 128, 4096) and sh["blk.93.attn_k.weight"] == (4 * 128, 4096)
    assert sh["blk.0.ffn_gate_exps.weight"] == (128, 1536, 4096)
    assert sh["blk.0.ffn_down_exps.weight"] == (128, 4096, 1536)
    assert 131.5 < p.stat().st_size / 2**30 < 133.5  # published Q4_K_M files: 132-133 GiB


def test_deepseek_v3_header(tmp_path):
    """Every key and tensor llama_model_deepseek2's loader reads (src/models/deepseek2.cpp)."""
    p = write_synth("deepseek-v3", tmp_path / "d.gguf", sparse=True).path
    kv, sh = _kv(p), _shapes(p)
    a = "deepseek2."
    assert kv["general.architecture"] == "deepseek2" and kv[a + "block_count"] == 61
    assert kv[a + "leading_dense_block_count"] == 3 and kv[a + "vocab_size"] == 129280
    assert (kv[a + "attention.q_lora_rank"], kv[a + "attention.kv_lora_rank"]) == (1536, 512)
    assert (kv[a + "attention.key_length"], kv[a + "attention.value_length"]) == (576, 512)
    assert (kv[a + "attention.key_length_mla"], kv[a + "attention.value_length_mla"]) == (192, 128)
    assert (kv[a + "attention.head_count"], kv[a + "attention.head_count_kv"]) == (128, 1)
    assert kv[a + "rope.dimension_count"] == 64 and kv[a + "rope.scaling.type"] == "yarn"
    assert (kv[a + "feed_forward_length"], kv[a + "expert_feed_forward_length"]) == (18432, 2048)
    assert (kv[a + "expert_count"], kv[a + "expert_used_count"], kv[a + "expert_shared_count"]) == (256, 8, 1)
    assert kv[a + "expert_gating_func"] == 2 and kv[a + "expert_weights_norm"] is True  # sigmoid
    assert (kv[a + "expert_group_count"], kv[a + "expert_group_used_count"]) == (8, 4)
    assert sh["token_embd.weight"] == sh["output.weight"] == (129280, 7168)
    assert sh["blk.0.attn_q_a.weight"] == (1536, 7168) and sh["blk.0.attn_q_b.weight"] == (128 * 192, 1536)
    assert sh["blk.0.attn_kv_a_mqa.weight"] == (576, 7168) and sh["blk.0.attn_kv_a_norm.weight"] == (512,)
    assert sh["blk.0.attn_k_b.weight"] == (128, 512, 128) and sh["blk.0.attn_v_b.weight"] == (128, 128, 512)
    assert sh["blk.0.attn_output.weight"] == (7168, 128 * 128)
    assert sh["blk.2.ffn_up.weight"] == (18432, 7168) and "blk.2.ffn_gate_inp.weight" not in sh
    assert "blk.3.ffn_up.weight" not in sh and sh["blk.3.ffn_gate_inp.weight"] == (256, 7168)
    assert sh["blk.60.exp_probs_b.bias"] == (256,)
    assert sh["blk.60.ffn_gate_exps.weight"] == (256, 2048, 7168)
    assert sh["blk.60.ffn_down_exps.weight"] == (256, 7168, 2048)
    assert sh["blk.60.ffn_up_shexp.weight"] == (2048, 7168) and sh["blk.60.ffn_down_shexp.weight"] == (7168, 2048)
    assert 375 < p.stat().st_size / 2**30 < 378  # published Q4_K_M files: ~404 GB


def test_deepseek_v3_layers_keep_the_dense_lead(tmp_path):
    p = write_synth("deepseek-v3", tmp_path / "d.gguf", layers=4, sparse=True).path
    sh = _shapes(p)
    assert _kv(p)["deepseek2.block_count"] == 4
    assert [f"blk.{i}.ffn_up.weight" in sh for i in range(4)] == [True, True, True, False]
    assert sh["blk.3.ffn_up_exps.weight"] == (256, 2048, 7168)


def test_gpt_oss_120b_header(tmp_path):
    """llama_model_openai_moe's keys and tensors (src/models/openai-moe.cpp), MXFP4 experts as released."""
    p = write_synth("gpt-oss-120b", tmp_path / "g.gguf", sparse=True).path
    kv, sh = _kv(p), _shapes(p)
    types = {t.name: t.ggml_type for t in read_header(p).tensors}
    a = "gpt-oss."
    assert kv["general.architecture"] == "gpt-oss" and kv[a + "block_count"] == 36
    assert kv["general.file_type"] == gguf.LlamaFileType.MOSTLY_MXFP4_MOE
    assert (kv[a + "embedding_length"], kv[a + "expert_feed_forward_length"]) == (2880, 2880)
    assert (kv[a + "expert_count"], kv[a + "expert_used_count"]) == (128, 4)
    assert (kv[a + "attention.head_count"], kv[a + "attention.head_count_kv"]) == (64, 8)
    assert kv[a + "attention.key_length"] == 64 and kv[a + "attention.sliding_window"] == 128
    assert kv[a + "rope.scaling.type"] == "yarn" and kv[a + "rope.scaling.factor"] == 32.0
    assert sh["token_embd.weight"] == sh["output.weight"] == (201088, 2880)
    assert sh["blk.0.attn_q.weight"] == (64 * 64, 2880) and sh["blk.0.attn_k.bias"] == (8 * 64,)
    assert sh["blk.0.attn_output.weight"] == (2880, 4096) and sh["blk.0.attn_output.bias"] == (2880,)
    assert sh["blk.35.attn_sinks.weight"] == (64,) and sh["blk.35.post_attention_norm.weight"] == (2880,)
    assert "blk.0.ffn_norm.weight" not in sh
    assert sh["blk.0.ffn_gate_inp.weight"] == (128, 2880) and sh["blk.0.ffn_gate_inp.bias"] == (128,)
    assert sh["blk.0.ffn_up_exps.weight"] == (128, 2880, 2880) and sh["blk.0.ffn_up_exps.bias"] == (128, 2880)
    assert sh["blk.0.ffn_down_exps.bias"] == (128, 2880)
    assert types["blk.0.ffn_down_exps.weight"] == Q.MXFP4 and types["blk.0.attn_q.weight"] == Q.Q8_0
    assert types["output.weight"] == types["token_embd.weight"] == Q.Q8_0
    assert types["blk.0.attn_sinks.weight"] == types["blk.0.ffn_up_exps.bias"] == Q.F32
    assert 58.5 < p.stat().st_size / 2**30 < 59.5  # the released MXFP4 GGUF: 63.4 GB


def test_units_of_the_new_tensor_roles(tmp_path):
    """Shared experts are dense FFN read every token; expert biases and exp_probs_b are not expert slices."""
    d = model_units(read_header(write_synth("deepseek-v3", tmp_path / "d.gguf", layers=4, sparse=True).path))
    roles = {u.key: (u.role, u.p) for u in d.units}
    assert roles["blk.3.ffn_down_shexp.weight"] == ("shared", 1.0)
    assert roles["blk.3.exp_probs_b.bias"][0] == "router" and roles["blk.0.attn_k_b.weight"][0] == "attn"
    assert sum(u.layer == 3 and u.role == "expert" for u in d.units) == 256
    g = model_units(read_header(write_synth("gpt-oss-120b", tmp_path / "g.gguf", layers=2, sparse=True).path))
    roles = {u.key: (u.role, u.p) for u in g.units}
    assert roles["blk.1.ffn_up_exps.bias"] == ("ffn", 1.0) and roles["blk.1.attn_sinks.weight"][0] == "attn"
    experts = [u for u in g.units if u.role == "expert" and u.layer == 1]
    assert len(experts) == 128 and experts[0].p == 4 / 128


# the smallest subsets of the real shapes: a few GiB each, written and run one at a time
SUBSETS = {"qwen3-235b-a22b": 1, "deepseek-v3": 2, "gpt-oss-120b": 1}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SUBSETS))
def test_subset_loads_and_generates(name, tmp_path):
    """Vanilla llama.cpp loads the real per-layer shapes and generates tokens on the CPU."""
    llama_cpp = pytest.importorskip("llama_cpp")
    r = write_synth(name, tmp_path / "m.gguf", layers=SUBSETS[name])
    llm = llama_cpp.Llama(str(r.path), n_ctx=64, n_threads=2, verbose=False)
    try:
        out = []
        for tok in llm.generate(llm.tokenize(b"Hello", add_bos=False), temp=0.0):
            out.append(tok)
            if len(out) == 4:
                break
        assert len(out) == 4 and all(0 <= t < r.shape.n_vocab for t in out)
        assert llm.n_vocab() == r.shape.n_vocab
    finally:
        llm.close()
        r.path.unlink()


@pytest.mark.parametrize("name", ["tiny-deepseek2", "tiny-qwen3moe"])
def test_kv_cache_size_is_llama_cpps(name, tmp_path, capfd):
    """The planner's KV cache is the one llama.cpp allocates: MLA (deepseek2) caches the latent K alone."""
    llama_cpp = pytest.importorskip("llama_cpp")
    r = write_synth(name, tmp_path / "m.gguf")
    llm = llama_cpp.Llama(str(r.path), n_ctx=4096, n_threads=1, verbose=True)
    llm.close()
    line = next(s for s in capfd.readouterr().err.splitlines() if s.startswith("llama_kv_cache: size ="))
    mib = float(line.split("=")[1].split("MiB")[0])
    dims = model_units(read_header(r.path)).dims
    assert dims.mla == (name == "tiny-deepseek2")
    assert abs(dims.kv_bytes_per_layer(4096) * dims.n_layer / 2**20 - mib) < 0.01
