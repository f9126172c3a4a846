"""The model file truncated or written in place while a plan's weights live in its mapping
(runtime/mapped_weights.py), in subprocesses: through hypura.Llama the next decode raises ModelFileError "changed
while in use" (a truncated mapping read by a decode would be SIGBUS); through the serve Server the request gets
an error body, the log has no traceback, and the server still answers /v1/models and another model's completion."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import pytest

from injected_faults import change_file, replace_file
from serve_helpers import free_port, stop, wait_ready

CHANGES = ["written", "truncated"]


@pytest.fixture
def mapped_plan(tiny_llama, tmp_path):
    """A plan whose CPU weights are held pinned: at home in the mapped file (a GPU plan's on a CPU machine)."""
    from hypura.plan import PlanSettings, plan_model
    from hypura.profile import machine_profile

    plan = plan_model(tiny_llama, machine_profile(), gpu_mem=0, ram="4GiB", settings=PlanSettings(n_ctx=256))
    plan = dataclasses.replace(plan, traffic=dataclasses.replace(plan.traffic, host_pinned=True))
    return plan.save(tmp_path / "mapped.json")


_DECODES = """
import sys
import hypura
from hypura.errors import ModelFileError

path, plan, how = sys.argv[1:]
sys.path.insert(0, {tests!r})
from injected_faults import change_file, replace_file
from pathlib import Path

llm = hypura.Llama(path, plan=plan, n_ctx=256, n_threads=1, verbose=False)
assert llm._runtime.mapped is not None
tokens = llm.tokenize(b"Once upon a time")
llm.eval(tokens)
change_file(Path(path), how)
try:
    llm.eval(tokens)
except ModelFileError as e:
    print("raised:", e)
llm.close()
"""


@pytest.mark.parametrize("how", CHANGES)
def test_the_next_decode_raises(tiny_llama, mapped_plan, tmp_path, how):
    model = tmp_path / "model.gguf"
    shutil.copyfile(tiny_llama, model)
    script = _DECODES.format(tests=os.path.dirname(__file__))
    run = subprocess.run([sys.executable, "-c", script, str(model), str(mapped_plan), how], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, f"status {run.returncode}: {run.stderr[-3000:]}"  # -7: SIGBUS
    what = "it shrank to" if how == "truncated" else "it was written to"
    assert run.stdout.startswith(f"raised: {model} changed while in use ({what}")


# the serve Server as `hypura serve` runs it, with a plan (which the CLI plans from budgets instead)
_SERVES = """
import logging, sys
from pathlib import Path
from hypura.serve.server import Server
from hypura.serve.settings import ServeSettings

a, b, plan, port = sys.argv[1:]
logging.basicConfig(level="INFO", format="%(levelname)s: %(message)s")
one = {"n_threads": 1, "n_threads_batch": 1}
settings = ServeSettings(models=(Path(a), Path(b)), port=int(port), parallel=1, n_ctx=256,
                         llama_kwargs={"plan": plan, **one})
Server(settings, log_level="info").run()
"""


def _streamed_until_changed(client, name: str, path, how: str) -> dict:
    """A streamed completion whose file is changed once two chunks came (decoding): its last chunk."""
    chunks = []
    with client.stream("POST", "/v1/completions", json={"model": name, "prompt": "Once upon a time",
                                                        "max_tokens": 240, "temperature": 0, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[len("data: "):]))
                if len(chunks) == 2:
                    change_file(path, how)
    return chunks[-1]


@pytest.mark.parametrize("how", CHANGES + ["replaced"])
def test_the_server_answers_an_error_then_loads_the_file_again(tiny_llama, mapped_plan, tmp_path, how):
    """A request decoding when the file changes gets an error body; the next request loads the file again: the
    same text where it holds the same bytes, an error body naming it while it is cut, the same text once it is
    restored (a new inode). The other model is served throughout."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("starlette")
    a, b, log = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "serve.log"
    for path in (a, b):
        shutil.copyfile(tiny_llama, path)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", _SERVES, str(a), str(b), str(mapped_plan), str(port)],
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_ready(proc, url)
        with httpx.Client(base_url=url, timeout=120) as client:
            names = sorted(m["id"] for m in client.get("/v1/models").json()["data"])
            assert [n.split(":")[0] for n in names] == ["a", "b"]

            def complete(name):
                return client.post("/v1/completions", json={"model": name, "prompt": "Once upon a time",
                                                            "max_tokens": 16, "temperature": 0})

            def text(name):
                r = complete(name)
                assert r.status_code == 200, r.text
                return r.json()["choices"][0]["text"]

            want = text(names[0])
            if how == "written":  # mid-decode: the request in flight ends with an error (unless it ran ahead)
                last = _streamed_until_changed(client, names[0], a, how)
                message = last.get("error", {}).get("message", "")
                assert f"{a} changed while in use" in message or last["choices"][0]["finish_reason"], last
            elif how == "truncated":  # between requests: a decode reading a page cut off the mapping is SIGBUS
                change_file(a, how)
            else:  # a new inode: the mapping keeps the old file, so the load is not void
                replace_file(a, tiny_llama.read_bytes())
            if how == "truncated":
                r = complete(names[0])
                assert r.status_code == 500 and str(a) in r.json()["error"]["message"], r.text
                assert text(names[1]) == want
                replace_file(a, tiny_llama.read_bytes())
            assert text(names[0]) == want
            assert text(names[1]) == want
            assert client.get("/v1/models").status_code == 200
    finally:
        status = stop(proc)
    text = log.read_text()
    assert status == 0 and "Traceback" not in text, text[-3000:]
    assert f"{a} changed since it was loaded" in text, text[-3000:]
