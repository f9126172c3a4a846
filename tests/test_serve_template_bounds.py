"""Untrusted chat templates are bounded in time, memory and place (issue 33): each template of
tests/hostile_templates.py froze the server (a big-integer power ran 31 s on the event loop, /health
unanswered) or took ~190 MB per request before its bound was checked. Now each is refused before it builds
anything, in well under its time bound, with RSS flat, while the server answers other requests."""

from __future__ import annotations

import time

import psutil
import pytest

from hypura.chat_template import ChatTemplate, TemplateError

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

from serve_fakes import MODEL, start_fake  # noqa: E402
from hostile_templates import HOSTILE, MESSAGES  # noqa: E402
from serve_helpers import health_probed  # noqa: E402


@pytest.mark.parametrize("name", list(HOSTILE))
def test_refused_before_it_builds_anything(name):
    rss = psutil.Process().memory_info().rss
    started = time.perf_counter()
    with pytest.raises(TemplateError) as e:
        ChatTemplate(HOSTILE[name]).render(MESSAGES)
    assert time.perf_counter() - started < 3.0  # ms; building it would take minutes or gigabytes
    assert "\n" not in str(e.value) and len(str(e.value)) < 300
    assert psutil.Process().memory_info().rss - rss < 64 << 20


def test_real_template_features_still_render():
    t = ChatTemplate("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                     "{{ '%5d|%-3s|%.2f' % (7, 'a', 1.5) }}{{ '{:>4}|{:02d}'.format(1, 3) }}{{ '%03d' | format(4) }}"
                     "{{ messages | tojson(indent=2) | length }}{{ ('a' ~ 'b') * 3 }}{{ 'a-b'.replace('-', '+') }}"
                     "{{ ['x', 'y'] | join(', ') }}{{ 'l1\nl2' | indent(2) }}{{ 2 ** 10 }}")
    out = t.render(MESSAGES)
    assert out.startswith("<|im_start|>user\nhi<|im_end|>\n    7|a  |1.50   1|03004")
    assert out.endswith("ababab" + "a+b" + "x, y" + "l1\n  l2" + "1024")


@pytest.mark.parametrize("name", ["power", "format-filter", "percent-star", "str-format-nested", "tojson-indent"])
def test_the_server_refuses_them_in_time_flat_and_serves_meanwhile(smollm2_path, name):
    server = start_fake(smollm2_path, template=HOSTILE[name])
    try:
        with health_probed(server.url, every=0.02) as health, httpx.Client(base_url=server.url, timeout=30) as c:
            chat = {"model": MODEL, "messages": MESSAGES, "stream": False}
            c.post("/api/chat", json=chat)  # warm up: imports, first allocations
            rss = psutil.Process().memory_info().rss
            for _ in range(9):
                started = time.monotonic()
                r = c.post("/api/chat", json=chat)
                assert r.status_code == 500 and "chat template" in r.json()["error"], r.text
                assert time.monotonic() - started < 5  # the template's 2 s, on a busy shared machine
            grown = psutil.Process().memory_info().rss - rss
            raw = c.post("/api/generate", json={"model": MODEL, "prompt": "x", "raw": True, "stream": False})
            assert raw.status_code == 200  # the same model, served meanwhile
    finally:
        server.stop()
    assert grown < 64 << 20, f"RSS grew {grown >> 20} MB over 9 requests"
    assert len(health) > 5 and max(health) < 1.0, max(health)
