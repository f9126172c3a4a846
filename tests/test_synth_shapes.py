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
