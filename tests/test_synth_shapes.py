"""The large MoE shapes of `hypura synth`: header-only files whose hparams and tensor shapes are
the published models', and small layer subsets that vanilla llama.cpp loads and runs."""

from __future__ import annotations

import pytest

from hypura.modelfile import read_header, read_kv
from hypura.synth.writer import write_synth


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
