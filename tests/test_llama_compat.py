"""A script written for llama_cpp.Llama runs unchanged with hypura.Llama, with the same results."""

import inspect

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


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2", "gemma"])
def test_user_script_runs_unchanged(model, request, n_threads):
    path = request.getfixturevalue(f"{model}_path")
    expected = llama_cpp_user_script(llama_cpp.Llama, path, n_threads)
    assert llama_cpp_user_script(hypura.Llama, path, n_threads) == expected
    assert expected["completion"] and expected["chat"] and expected["stream"]


def _function(attr):
    """The function behind a class attribute (a method, classmethod or staticmethod), else None."""
    attr = getattr(attr, "__func__", attr)
    return attr if inspect.isfunction(attr) else None


def _incompatibilities(ours: type, theirs: type) -> list[str]:
    """Where a call written for `theirs` (its public methods, __init__ and __call__) would not mean the same
    on `ours`: a missing name, a property become something else, or an overriding method that does not
    take one of their parameters (by name, or by position), requires one they do not, or changes a default."""
    found = []
    for name in sorted(n for n in dir(theirs) if not n.startswith("_") or n in ("__init__", "__call__")):
        if not hasattr(ours, name):
            found.append(f"{name}: missing")
            continue
        a, b = inspect.getattr_static(theirs, name), inspect.getattr_static(ours, name)
        if isinstance(a, property) and not isinstance(b, property):
            found.append(f"{name}: a property of theirs is a {type(b).__name__}")
        fa, fb = _function(a), _function(b)
        if fa is None or fa is fb:
            continue  # not a method, or inherited as it is
        if fb is None:
            found.append(f"{name}: a method of theirs is a {type(b).__name__}")
            continue
        sa, sb = inspect.signature(fa), inspect.signature(fb)
        pb = sb.parameters
        named = {n: q for n, q in pb.items() if q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD)}
        var_kw = any(p.kind is p.VAR_KEYWORD for p in pb.values())
        for p in sa.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                if not any(q.kind is p.kind for q in pb.values()):
                    found.append(f"{name}: takes no {'*args' if p.kind is p.VAR_POSITIONAL else '**kwargs'}")
            elif p.name not in named:
                if p.kind is p.POSITIONAL_ONLY or not var_kw:
                    found.append(f"{name}: no parameter {p.name}")
            elif p.default is not p.empty and named[p.name].default != p.default:
                found.append(f"{name}({p.name}=...): default {named[p.name].default!r}, theirs {p.default!r}")
        positional = [p.name for p in sa.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        try:
            bound = sb.bind_partial(*positional)  # each argument's value is the name of their parameter it fills
        except TypeError as e:
            found.append(f"{name}: their positional call fails: {e}")
            continue
        for param, value in bound.arguments.items():
            if pb[param].kind is not pb[param].VAR_POSITIONAL and param != value:
                found.append(f"{name}: their positional {value} lands on {param}")
        required = [p.name for p in named.values() if p.default is p.empty and p.name not in sa.parameters]
        if required:
            found.append(f"{name}: requires {', '.join(required)}")
    return found


def test_every_public_method_takes_llama_cpps_arguments():
    assert _incompatibilities(hypura.Llama, llama_cpp.Llama) == []


def test_the_compatibility_check_finds_what_breaks_a_script():
    class Broken(llama_cpp.Llama):
        def tokenize(self, text: bytes, special: bool = False, add_bos: bool = True):  # order swapped
            return []

        def detokenize(self, tokens, prev_tokens=None, special: bool = True):  # a default changed
            return b""

        def reset(self, hard):  # a parameter theirs lacks, required
            pass

        def eval(self, *tokens):  # their `tokens` by name no longer works
            pass

        n_ctx = 512  # a method become a value

    assert _incompatibilities(Broken, llama_cpp.Llama) == [
        "detokenize(special=...): default True, theirs False",
        "eval: no parameter tokens",
        "n_ctx: a method of theirs is a int",
        "reset: requires hard",
        "tokenize: their positional add_bos lands on special",
        "tokenize: their positional special lands on add_bos",
    ]
