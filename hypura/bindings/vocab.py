"""A model's vocabulary over llama.cpp's llama_vocab (through llama-cpp-python's 1:1 ctypes binding):
common_tokenize, common_token_to_piece and the special tokens, for every front end (hypura.Llama, hypura-cli,
the engine). Pieces and end-of-generation flags are cached per token: the vocabulary does not change."""

from __future__ import annotations

import ctypes

import llama_cpp


class Vocab:
    def __init__(self, model):
        """model: llama-cpp-python's `llama_model_p` (the vocabulary lives as long as the model)."""
        self.vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_tokens = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self._buf = ctypes.create_string_buffer(256)
        self._pieces: dict[tuple[int, bool], bytes] = {}
        self._eog: dict[int, bool] = {}

    def tokenize(self, text: bytes, add_special: bool, parse_special: bool) -> list[int]:
        """The buffer is sized by the text (a token per byte at most, BOS, EOS and a space prefix), never by the
        model's training context (llama-cpp-python's: gigabytes where a file states billions)."""
        n_max = len(text) + 3
        tokens = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self.vocab, text, len(text), tokens, n_max, add_special, parse_special)
        if n < 0:  # llama_tokenize asks for a buffer of -n tokens
            tokens = (llama_cpp.llama_token * -n)()
            n = llama_cpp.llama_tokenize(self.vocab, text, len(text), tokens, -n, add_special, parse_special)
        if n < 0:
            raise RuntimeError(f"Failed to tokenize: {len(text)} bytes of text, n_tokens={n}")
        return list(tokens[:n])

    def piece(self, token: int, special: bool = True) -> bytes:
        """A token's bytes; special tokens rendered (special) or not."""
        key = (token, special)
        piece = self._pieces.get(key)
        if piece is None:
            n = llama_cpp.llama_token_to_piece(self.vocab, token, self._buf, len(self._buf), 0, special)
            if n < 0:
                self._buf = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(self.vocab, token, self._buf, len(self._buf), 0, special)
            piece = self._pieces[key] = self._buf.raw[:n]
        return piece

    def is_eog(self, token: int) -> bool:
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = 0 <= token < self.n_tokens and bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))
        return eog

    @property
    def bos(self) -> int:
        return llama_cpp.llama_vocab_bos(self.vocab)

    @property
    def eos(self) -> int:
        return llama_cpp.llama_vocab_eos(self.vocab)

    @property
    def add_bos(self) -> bool:
        return llama_cpp.llama_vocab_get_add_bos(self.vocab)

    def eot_or_eos(self) -> int:
        eot = llama_cpp.llama_vocab_eot(self.vocab)
        return self.eos if eot == llama_cpp.LLAMA_TOKEN_NULL else eot

    def suppressed(self) -> list[int]:
        """Tokens the model file says are never generated (llama.cpp biases them to -inf)."""
        n = ctypes.c_int32(0)
        tokens = llama_cpp.llama_vocab_get_suppress_tokens(self.vocab, ctypes.byref(n))
        return [tokens[i] for i in range(n.value)]
