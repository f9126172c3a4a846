"""hypura.Llama builds llama_cpp.Llama's state itself: every attribute llama_cpp.Llama's methods read exists,
and the paths that read the rarer ones (chat, embeddings, saved state, streams, the cache) give what
llama_cpp.Llama gives."""

import ast
import inspect

import pytest

import hypura

import llama_cpp  # after hypura: it must load hypura's library


def _attributes_read_by_methods(cls: type) -> set[str]:
    """`self.X` read in cls's own methods (not __init__), X not one of its methods or properties."""
    tree = ast.parse(inspect.getsource(inspect.getmodule(cls)))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    members = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
    read = set()
    for fn in node.body:
        if isinstance(fn, ast.FunctionDef) and fn.name != "__init__":
            read |= {a.attr for a in ast.walk(fn) if isinstance(a, ast.Attribute) and isinstance(a.ctx, ast.Load)
                     and isinstance(a.value, ast.Name) and a.value.id == "self"}
    return read - members


@pytest.fixture(scope="module")
def llm(smollm2_path, n_threads):
    llm = hypura.Llama(str(smollm2_path), n_ctx=512, n_threads=n_threads, seed=7, verbose=False)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def theirs(smollm2_path, n_threads):
    llm = llama_cpp.Llama(str(smollm2_path), n_ctx=512, n_threads=n_threads, seed=7, verbose=False)
    yield llm
    llm.close()


def test_every_attribute_their_methods_read_is_set(llm):
    read = _attributes_read_by_methods(llama_cpp.Llama)
    assert {"_ctx", "_batch", "_model", "n_tokens", "input_ids", "_chat_handlers"} <= read  # the scan sees them
    assert sorted(name for name in read if name not in vars(llm)) == []


@pytest.mark.slow
def test_chat_stream_state_and_cache_as_llama_cpp(llm, theirs):
    messages = [{"role": "user", "content": "Name two colours."}]
    assert llm.chat_format == theirs.chat_format and set(llm._chat_handlers) == set(theirs._chat_handlers)
    assert llm.metadata == theirs.metadata and llm.n_batch == theirs.n_batch and llm.n_ctx() == theirs.n_ctx()
    chat = [m.create_chat_completion(messages, max_tokens=12, temperature=0.0)["choices"][0]["message"]["content"]
            for m in (llm, theirs)]
    assert chat[0] == chat[1] and chat[0]
    stream = ["".join(c["choices"][0]["text"] for c in m("Once upon a time", max_tokens=10, temperature=0.0,
                                                            stream=True)) for m in (llm, theirs)]
    assert stream[0] == stream[1]

    llm.reset()
    llm.eval(llm.tokenize(b"The sky is"))
    state = llm.save_state()
    first = llm.create_completion("The sky is", max_tokens=6, temperature=0.0)["choices"][0]["text"]
    llm.eval(llm.tokenize(b" unrelated tokens", add_bos=False))
    llm.load_state(state)
    assert llm.n_tokens == state.n_tokens
    assert llm.create_completion("The sky is", max_tokens=6, temperature=0.0)["choices"][0]["text"] == first

    llm.set_cache(llama_cpp.LlamaRAMCache(capacity_bytes=1 << 26))
    try:
        again = [llm.create_completion("Hello there", max_tokens=4, temperature=0.0)["choices"][0]["text"]
                 for _ in range(2)]
    finally:
        llm.set_cache(None)
    assert again[0] == again[1]
    assert llm.stats()["decode"]["tokens"] > 0  # llama_cpp's own eval decoded through the runtime


@pytest.mark.slow
def test_embeddings_as_llama_cpp(smollm2_path, n_threads):
    texts = ["a red apple", "the stock market fell"]
    out = []
    for cls in (hypura.Llama, llama_cpp.Llama):
        m = cls(str(smollm2_path), n_ctx=256, embedding=True, n_threads=n_threads, verbose=False)
        try:
            out.append((m.context_params.n_seq_max, m.embed(texts),
                        m.create_embedding(texts[0])["data"][0]["embedding"]))
        finally:
            m.close()
    assert out[0] == out[1] and len(out[0][1]) == len(texts)  # bitwise: the same kernels, the same state


@pytest.mark.slow
def test_unknown_keywords_ignored_and_bad_ones_refused(smollm2_path, n_threads):
    with pytest.raises(TypeError):
        hypura.Llama(str(smollm2_path), "positional", n_threads=n_threads, verbose=False)
    llm = hypura.Llama(str(smollm2_path), n_ctx=256, n_threads=n_threads, verbose=False, not_a_llama_arg=1,
                       param_overrides={"context_params": {"n_batch": 64}})
    try:
        assert llm.n_batch == llm.context_params.n_batch == 64  # eval splits prompts as the context takes them
        assert llm.create_completion("1 2 3 4 5 6 7 8 9 10 " * 4, max_tokens=2)["usage"]["prompt_tokens"] > 64
    finally:
        llm.close()
