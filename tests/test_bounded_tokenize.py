"""hypura.Llama.tokenize sizes its buffer by the text, not by the model's training context (a file's
context_length of 2 billion made llama-cpp-python allocate 8 GB per call), with the same tokens."""

import pytest

import hypura


@pytest.fixture(scope="module")
def llm(smollm2_path, n_threads):
    model = hypura.Llama(str(smollm2_path), n_ctx=256, n_threads=n_threads, verbose=False)
    yield model
    model.close()


TEXTS = [b"", b"hi", b"Hello, world!", "na\u00efve caf\u00e9 \u2615 \U0001F600".encode(), b"<|im_start|>user\nhi<|im_end|>",
         b"word " * 5000]


@pytest.mark.parametrize("text", TEXTS, ids=["empty", "hi", "hello", "unicode", "special", "long"])
@pytest.mark.parametrize("add_bos, special", [(True, False), (False, True), (True, True)])
def test_tokens_are_llama_cpp_pythons(llm, text, add_bos, special):
    assert llm.tokenize(text, add_bos=add_bos, special=special) == \
        llm._model.tokenize(text, add_bos=add_bos, special=special)
