"""Chat templates from GGUF files: rendered as llama-cpp-python renders them, and only inside a bounded
sandbox. Hostile templates (escapes, endless loops, huge values, parse and render errors) give one
TemplateError line, never a traceback, an escape or a hang."""

from __future__ import annotations

import time

import pytest
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from hypura.chat_template import ChatTemplate, TemplateError, TemplateLimits, TemplateRejected
from hypura.errors import HypuraError
from hypura.modelfile import read_header

CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Name a planet."}]

# shapes real GGUF templates take: BOS, role checks with raise_exception, loop.index, namespace, tojson
LLAMA3_LIKE = ("{{ bos_token }}{% for m in messages %}{% if loop.index0 > 0 and "
               "m['role'] == messages[loop.index0 - 1]['role'] %}{{ raise_exception('roles must alternate') }}"
               "{% endif %}"
               "<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>"
               "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
NAMESPACE_TOOLS = ("{% set ns = namespace(system='') %}{% for m in messages %}{% if m.role == 'system' %}"
                   "{% set ns.system = m.content %}{% endif %}{% endfor %}[SYS]{{ ns.system }}[/SYS]"
                   "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages if m.role != 'system' %}"
                   "{% generation %}<{{ m.role }}>{{ m.content }}{% endgeneration %}{% endfor %}"
                   "{{ strftime_now('%Y') | length }}")


@pytest.fixture(scope="module")
def smollm2_template(smollm2_path) -> str:
    return read_header(smollm2_path).metadata["tokenizer.chat_template"]


def _llama_cpp_python(source: str, messages, **kwargs) -> str:
    return Jinja2ChatFormatter(source, eos_token="</s>", bos_token="<s>")(messages=messages, **kwargs).prompt


@pytest.mark.parametrize("name", ["smollm2", "llama3", "namespace"])
def test_renders_as_llama_cpp_python(smollm2_template, name):
    source = {"smollm2": smollm2_template, "llama3": LLAMA3_LIKE, "namespace": NAMESPACE_TOOLS}[name]
    template = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
    for messages in (CONVERSATION, CONVERSATION[1:2]):
        assert template.render(messages) == _llama_cpp_python(source, messages)
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    assert template.render(CONVERSATION, tools=tools) == _llama_cpp_python(source, CONVERSATION, tools=tools)


def test_the_template_refusing_a_conversation_is_its_own_error():
    template = ChatTemplate(LLAMA3_LIKE)
    with pytest.raises(TemplateRejected, match="roles must alternate"):
        template.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.system('touch /tmp/hypura-pwned') }}",
    "{{ joiner.__init__.__globals__['__builtins__']['open']('/etc/passwd').read() }}",
    "{{ namespace.__init__.__globals__ }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{{ (messages|first).items.__self__.__class__ }}",
    "{{ self._TemplateReference__context }}",
    "{% for m in messages %}{{ m.update({'role': 'x'}) }}{% endfor %}",
    "{{ messages.append(1) or messages.pop() }}",
    "{{ raise_exception.__globals__ }}",
    "{{ ''.format.__globals__ }}",
    "{{ '{0.__class__.__mro__}'.format(messages) }}",
])
def test_no_sandbox_escape(source, tmp_path):
    messages = [{"role": "user", "content": "x"}]
    try:
        out = ChatTemplate(source).render(messages)
    except TemplateError as e:
        assert "\n" not in str(e) and len(str(e)) < 400
    else:  # what the sandbox allows renders as nothing: an undefined value
        assert "class" not in out and "object" not in out and "root:" not in out
    assert messages == [{"role": "user", "content": "x"}]  # never mutated
    assert not (tmp_path / "hypura-pwned").exists()


@pytest.mark.parametrize("source,word", [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "range items"),
    ("{% for i in range(2000) %}{% for j in range(2000) %}{{ messages[0].content }}{% endfor %}{% endfor %}",
     "longer than"),
    ("{{ 'a' * 100000000 }}", "repeated"),
    ("{{ [1] * 100000000 }}", "repeated"),
    ("{{ 10 ** 100000000 }}", "number"),
    ("{{ 'x' | center(1000000000) }}", "number"),
    ("{{ 'x'.ljust(1000000000) }}", "number"),
    ("{{ '%1000000000d' % 1 }}", "number"),
    ("{{ '{:>1000000000}'.format(1) }}", "number"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "items"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursed"),
    ("{{ lipsum() }}", "lipsum"),
])
def test_runaway_templates_are_bounded(source, word):
    started = time.monotonic()
    with pytest.raises(TemplateError, match=word):
        ChatTemplate(source, limits=TemplateLimits(seconds=1.0)).render([{"role": "user", "content": "x"}])
    assert time.monotonic() - started < 3  # the deadline, plus unwinding


def test_output_is_bounded():
    limits = TemplateLimits(max_chars=10_000)
    with pytest.raises(TemplateError, match="output is longer"):
        ChatTemplate("{% for i in range(100) %}{{ 'x' * 500 }}{% endfor %}", limits=limits).render([])


@pytest.mark.parametrize("source,word", [
    ("{% if %}", "does not parse: line 1"), ("{% for m in messages %}", "does not parse"),
    ("{{ 'x' | no_such_filter }}", "does not parse"), ("", "empty")])
def test_parse_errors_are_one_line(source, word):
    with pytest.raises(TemplateError, match=word) as e:
        ChatTemplate(source)
    assert isinstance(e.value, HypuraError) and "\n" not in str(e.value)


@pytest.mark.parametrize("source,word", [
    ("{{ 1 / 0 }}", "ZeroDivisionError"), ("{{ messages[5].content }}", "failed"),
    ("{{ undefined_thing.attr }}", "undefined"), ("{{ messages | map(attribute='x') | sum }}", "failed"),
    ("{{ 'a' + 1 }}", "TypeError")])
def test_render_errors_are_one_line(source, word):
    with pytest.raises(TemplateError, match=word) as e:
        ChatTemplate(source).render([{"role": "user", "content": "x"}])
    assert "\n" not in str(e.value) and "Traceback" not in str(e.value)


def test_error_messages_are_printable_and_short():
    with pytest.raises(TemplateRejected) as e:
        ChatTemplate("{{ raise_exception('bad\\n\\x1b[31m' + 'x' * 5000) }}").render([])
    assert e.value.args[0].isprintable() and len(str(e.value)) < 300


# --- hypura.Llama's chat completions: the same bounded renderer ------------------------------------------

def _with_template(src, dst, template: str):
    """A copy of the GGUF `src` whose tokenizer.chat_template is `template` (the header rewritten, the data copied)."""
    import shutil

    from gguf import GGUFValueType

    from hypura.chat_template import METADATA_KEY
    from hypura.modelfile import KV, read_kv
    from hypura.modelfile.writer import TensorInfo, header_bytes

    h = read_header(src)
    kvs = [kv for kv in read_kv(src) if kv.key != METADATA_KEY] + [KV(METADATA_KEY, template, GGUFValueType.STRING,
                                                                     None)]
    infos = [TensorInfo(t.name, tuple(reversed(t.shape)), t.ggml_type, t.offset - h.data_offset) for t in h.tensors]
    with open(src, "rb") as s, open(dst, "wb") as d:
        d.write(header_bytes(kvs, infos, int(h.get("general.alignment", 32))))
        s.seek(h.data_offset)
        shutil.copyfileobj(s, d)
    return dst


@pytest.mark.parametrize("name", ["power", "format-filter", "percent-star", "percent-many", "parse-error"])
def test_a_hostile_template_raises_from_llamas_chat_completion(name, tiny_llama, tmp_path):
    """A GGUF whose template froze the server: hypura.Llama loads it (a completion needs no template) and its
    chat completion raises TemplateError in bounded time (llama-cpp-python's Jinja2ChatFormatter ran the
    power for 31 s), the same refusal the server gives; a template that does not parse too."""
    from hostile_templates import HOSTILE, MESSAGES
    from hypura import Llama

    template = {**HOSTILE, "parse-error": "{% if %}"}[name]
    llm = Llama(str(_with_template(tiny_llama, tmp_path / "hostile.gguf", template)), n_ctx=64, n_threads=1,
                verbose=False)
    try:
        assert llm.chat_format == "chat_template.default"
        started = time.perf_counter()
        with pytest.raises(TemplateError, match="chat template") as e:
            llm.create_chat_completion(MESSAGES, max_tokens=1)
        assert time.perf_counter() - started < TemplateLimits().seconds  # refused before it builds anything
        assert "\n" not in str(e.value)
        assert llm.create_completion("x", max_tokens=1)["choices"][0]["finish_reason"] == "length"
    finally:
        llm.close()


def test_llamas_chat_completion_renders_the_models_template_as_llama_cpp_python(smollm2_path, smollm2_template):
    """The bounded renderer's prompt is llama-cpp-python's Jinja2ChatFormatter's for SmolLM2's own template, and
    create_chat_completion keeps llama-cpp-python's response shape."""
    from hypura import Llama
    from hypura.bindings.chat_formats import BoundedChatFormatter

    ours = BoundedChatFormatter(smollm2_template, "<|im_end|>", "<|im_start|>", [2])(messages=CONVERSATION, tools=None)
    theirs = Jinja2ChatFormatter(smollm2_template, "<|im_end|>", "<|im_start|>", stop_token_ids=[2])(
        messages=CONVERSATION, tools=None)
    assert (ours.prompt, ours.stop, ours.added_special) == (theirs.prompt, theirs.stop, theirs.added_special)
    llm = Llama(str(smollm2_path), n_ctx=256, n_threads=1, chat_format="chat_template.default", verbose=False)
    try:
        r = llm.create_chat_completion(CONVERSATION, max_tokens=4, temperature=0.0)
        assert r["object"] == "chat.completion" and r["choices"][0]["message"]["role"] == "assistant"
        assert r["usage"]["completion_tokens"] <= 4
    finally:
        llm.close()
