"""`Llama(path, vocab_only=True)` loads the vocabulary alone, as llama_cpp.Llama does: of a whole model, and of a file
that holds nothing else (no tensor: llama.cpp's vocabulary-only GGUFs), tokenizing as llama_cpp.Llama does."""

from __future__ import annotations

from pathlib import Path

import pytest

import hypura
import llama_cpp
from hypura.errors import ModelFileError
from hypura.modelfile import read_kv
from hypura.modelfile.writer import header_bytes

# the vocabulary-only GGUFs llama.cpp tests its tokenizers with (vendor/llama.cpp is made by ./build.sh)
VOCABS = Path(__file__).resolve().parents[1] / "vendor" / "llama.cpp" / "models"
TEXTS = [b"", b"Hello world", b"  two leading spaces,\n\ttabs and\r\nlines", "héllo wörld: ünïcode 🤖 中文".encode(),
         b"<|im_start|>user\nhi<|im_end|> <s></s> [INST]", b"3.14159 + 2,718 = 5.86 ... !!!"]


def _same_tokenizer(ours, theirs) -> None:
    assert (ours.n_vocab(), ours.n_ctx(), ours.token_bos(), ours.token_eos()) == \
        (theirs.n_vocab(), theirs.n_ctx(), theirs.token_bos(), theirs.token_eos())
    for text in TEXTS:
        for add_bos in (True, False):
            for special in (False, True):
                assert ours.tokenize(text, add_bos, special) == theirs.tokenize(text, add_bos, special), (text, special)
        tokens = theirs.tokenize(text, special=True)
        assert ours.detokenize(tokens) == theirs.detokenize(tokens)
        assert ours.detokenize(tokens, special=True) == theirs.detokenize(tokens, special=True)


@pytest.fixture(scope="module")
def smollm2_vocab(smollm2_path, tmp_path_factory) -> Path:
    """SmolLM2's metadata, its tokenizer with it, and not one tensor."""
    path = tmp_path_factory.mktemp("vocab") / "smollm2-vocab.gguf"
    path.write_bytes(header_bytes(read_kv(smollm2_path), [], alignment=32))
    return path


def test_a_vocabulary_only_file_tokenizes_as_llama_cpp_and_as_its_model(smollm2_vocab, smollm2_path):
    ours = hypura.Llama(str(smollm2_vocab), vocab_only=True, verbose=False)
    theirs = llama_cpp.Llama(str(smollm2_vocab), vocab_only=True, verbose=False)
    whole = llama_cpp.Llama(str(smollm2_path), vocab_only=True, verbose=False)
    try:
        _same_tokenizer(ours, theirs)
        _same_tokenizer(ours, whole)
        assert ours.metadata == theirs.metadata and ours.plan is None  # nothing planned: no weight to place
    finally:
        ours.close(), theirs.close(), whole.close()


def test_a_whole_model_loaded_for_its_vocabulary_plans_nothing(smollm2_path):
    ours = hypura.Llama(str(smollm2_path), vocab_only=True, verbose=False)
    theirs = llama_cpp.Llama(str(smollm2_path), vocab_only=True, verbose=False)
    try:
        _same_tokenizer(ours, theirs)
        assert ours.plan is None
    finally:
        ours.close(), theirs.close()


def test_without_vocab_only_a_file_of_no_tensor_is_still_refused_in_one_line(smollm2_vocab):
    with pytest.raises(ModelFileError, match=r"smollm2-vocab\.gguf: tensor count is 0: expected at least one"):
        hypura.Llama(str(smollm2_vocab), verbose=False)


# a few kinds (SentencePiece, a non-causal BERT's WordPiece, a recent BPE) at every run, the rest among the slow tests
QUICK = ("ggml-vocab-llama-spm.gguf", "ggml-vocab-bert-bge.gguf", "ggml-vocab-gemma-4.gguf")


@pytest.mark.parametrize("name", [pytest.param(p.name, marks=() if p.name in QUICK else pytest.mark.slow)
                                  for p in sorted(VOCABS.glob("ggml-vocab-*.gguf"))])
def test_llama_cpps_vocabulary_files_tokenize_as_in_llama_cpp(name):
    ours = hypura.Llama(str(VOCABS / name), vocab_only=True, verbose=False)
    theirs = llama_cpp.Llama(str(VOCABS / name), vocab_only=True, verbose=False)
    try:
        _same_tokenizer(ours, theirs)
    finally:
        ours.close(), theirs.close()


def test_llama_cpps_vocabulary_files_are_there():
    assert all((VOCABS / name).is_file() for name in QUICK), "vendor/llama.cpp is made by ./build.sh"
