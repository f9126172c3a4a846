"""A script written for llama_cpp.Llama runs unchanged with hypura.Llama, with the same results."""

import pytest

import hypura

import llama_cpp


def llama_cpp_user_script(Llama, model_path, n_threads):
    """What a llama-cpp-python user writes; returns everything it printed or checked."""
    llm = Llama(model_path=str(model_path), n_ctx=512, n_threads=n_threads, seed=42, verbose=False)
    seen = {}

    out = llm("Q: What is the capital of France? A:", max_tokens=24, temperature=0.0, stop=["Q:"])
    assert out["object"] == "text_completion"
    assert set(out["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    seen["completion"] = out["choices"][0]["text"]
    seen["finish_reason"] = out["choices"][0]["finish_reason"]

    chat = llm.create_chat_completion(
        messages=[
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Name three colours."},
        ],
        max_tokens=24,
        temperature=0.0,
    )
    assert chat["object"] == "chat.completion"
    seen["chat"] = chat["choices"][0]["message"]["content"]
    assert chat["choices"][0]["message"]["role"] == "assistant"

    chunks = list(llm.create_completion("Once upon a time", max_tokens=16, temperature=0.0, stream=True))
    assert all(c["object"] == "text_completion" for c in chunks)
    seen["stream"] = "".join(c["choices"][0]["text"] for c in chunks)

    stream_chat = llm.create_chat_completion(
        messages=[{"role": "user", "content": "Say hello."}], max_tokens=12, temperature=0.0, stream=True
    )
    seen["stream_chat"] = "".join(c["choices"][0]["delta"].get("content", "") for c in stream_chat)

    text = "Hello, wörld! 123 — tokens?"
    tokens = llm.tokenize(text.encode(), add_bos=False)
    assert llm.detokenize(tokens).decode() == text
    seen["tokens"] = tokens

    llm.reset()
    llm.eval(llm.tokenize(b"The sky is"))
    seen["n_tokens"] = llm.n_tokens
    seen["argmax"] = int(llm.scores[llm.n_tokens - 1].argmax())
    seen["n_ctx"] = llm.n_ctx()
    seen["generate"] = [t for _, t in zip(range(8), llm.generate(llm.tokenize(b"1, 2, 3,"), temp=0.0))]
    llm.close()
    return seen


@pytest.mark.parametrize("model", ["smollm2", "gemma"])
def test_user_script_runs_unchanged(model, request, n_threads):
    path = request.getfixturevalue(f"{model}_path")
    expected = llama_cpp_user_script(llama_cpp.Llama, path, n_threads)
    assert llama_cpp_user_script(hypura.Llama, path, n_threads) == expected
    assert expected["completion"] and expected["chat"] and expected["stream"]


def test_same_public_surface():
    public = {n for n in dir(llama_cpp.Llama) if not n.startswith("_")}
    assert public <= set(dir(hypura.Llama))
