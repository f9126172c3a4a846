"""Models by name: a fake Ollama store built from the test models (tests/ollama_store.py), resolved as Ollama
resolves names, by hypura.store, `hypura-cli -m`, `hypura.Llama`, `hypura inspect` and `hypura list`; LM
Studio's folder and --models-dir found the same way; broken entries one line each."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from hypura.errors import HypuraError
from hypura.store import Catalog, resolve_model
from hypura.store.names import parse
from ollama_store import add_model, fake_store


@pytest.fixture()
def store(tmp_path, monkeypatch, smollm2_path, gemma_path):
    root = fake_store(tmp_path / "ollama", smollm2_path, gemma_path)
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no LM Studio folder but the test's
    monkeypatch.delenv("HYPURA_MODELS", raising=False)
    return root


def test_names_parse_as_ollama():
    assert parse("qwen3").short() == "qwen3:latest"
    assert parse("Qwen3:30B-A3B").short() == "qwen3:30b-a3b"
    assert parse("library/qwen3:8b").short() == "qwen3:8b"
    assert parse("registry.ollama.ai/someone/m:q4").short() == "someone/m:q4"
    assert parse("host:5000/ns/m").short() == "host:5000/ns/m:latest"


@pytest.mark.parametrize("name", ["smol", "smol:latest", "library/smol", "registry.ollama.ai/library/smol:latest",
                                  "SMOL:LATEST"])
def test_ollama_names_resolve_to_the_blob(store, name):
    m = resolve_model(name)
    assert m.source == "ollama" and m.name == "smol:latest"
    assert m.path.parent == store / "blobs" and m.path.name.startswith("sha256-")
    assert m.params["temperature"] == 0.25


def test_namespace_and_tag(store, gemma_path):
    assert resolve_model("someone/smol:tiny").name == "someone/smol:tiny"
    assert resolve_model("gemma3:270m").path.stat().st_size == gemma_path.stat().st_size
    with pytest.raises(HypuraError, match=r"model named 'someone/smol'.*close matches: .*someone/smol:tiny"):
        resolve_model("someone/smol")  # latest by default: this namespace has only :tiny


def test_digest_is_the_manifests_sha256(store):
    m = resolve_model("gemma3:270m")
    manifest = store / "manifests/registry.ollama.ai/library/gemma3/270m"
    assert m.digest == hashlib.sha256(manifest.read_bytes()).hexdigest()
    assert m.size > m.path.stat().st_size  # every layer, the config included, as `ollama list` counts


def test_no_match_is_one_line_with_close_matches(store):
    with pytest.raises(HypuraError) as e:
        resolve_model("gemma3")
    assert "\n" not in str(e.value) and "close matches: gemma3:270m" in str(e.value)
    with pytest.raises(HypuraError, match="close matches: smol:latest"):
        resolve_model("smoll")


@pytest.mark.parametrize("name, why", [("broken:json", "not a JSON manifest"), ("broken:missing", "missing"),
                                       ("broken:notgguf", "not a GGUF file")])
def test_broken_entries_one_line_each(store, name, why):
    catalog = Catalog.scan()
    assert {p.name for p in catalog.problems} == {"broken:json", "broken:missing", "broken:notgguf"}
    with pytest.raises(HypuraError) as e:
        resolve_model(name)
    assert why in str(e.value) and "\n" not in str(e.value)


def test_paths_keep_working(store, smollm2_path, tmp_path):
    assert resolve_model(str(smollm2_path)).path == smollm2_path
    assert resolve_model(smollm2_path).source == "file"
    assert resolve_model(str(tmp_path / "missing.gguf")).path == tmp_path / "missing.gguf"  # its error: the file's


def test_lmstudio_and_models_dir(store, tmp_path, smollm2_path, gemma_path, monkeypatch):
    repo = tmp_path / "home/.lmstudio/models/lmstudio-community/gemma-3-270m-GGUF"
    repo.mkdir(parents=True)
    os.link(gemma_path, repo / "gemma-3-270m-Q4_K_M.gguf")
    folder = tmp_path / "ggufs"
    folder.mkdir()
    os.link(smollm2_path, folder / smollm2_path.name)
    assert resolve_model("lmstudio-community/gemma-3-270m:q4_k_m").source == "lmstudio"
    assert resolve_model("gemma-3-270m").path == repo / "gemma-3-270m-Q4_K_M.gguf"  # the short form, unique
    assert resolve_model("smollm2-135m-instruct:q4_1", models_dir=folder).source == "folder"
    monkeypatch.setenv("HYPURA_MODELS", str(folder))
    assert resolve_model("smollm2-135m-instruct").path == folder / smollm2_path.name


def test_llama_by_name(store):
    import hypura

    llm = hypura.Llama("someone/smol:tiny", n_ctx=64, n_threads=1, verbose=False)
    try:
        assert llm.header.arch == "llama" and llm.model_path.endswith(resolve_model("someone/smol:tiny").path.name)
    finally:
        llm.close()


def test_inspect_and_list_by_name(store):
    from hypura.cli.main import cli

    result = CliRunner().invoke(cli, ["inspect", "gemma3:270m", "--profile", "h200-design", "-c", "512"])
    assert result.exit_code == 0, result.output
    assert "planned in" in result.output
    listed = CliRunner().invoke(cli, ["list"])
    assert listed.exit_code == 0, listed.output
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert set(rows) == {"gemma3:270m", "smol:latest", "someone/smol:tiny"}
    assert "Q4_K_M" in rows["gemma3:270m"] and "Q4_1" in rows["smol:latest"]
    assert listed.stderr.count("cannot use broken:") == 3


def test_list_plan(store, monkeypatch):
    from hypura.cli.main import cli
    from hypura.profile import free

    monkeypatch.setattr(free, "OVERRIDE", "gpu=0,ram=8GiB")  # hermetic: the plan must not depend on this machine's RAM
    listed = CliRunner().invoke(cli, ["list", "--plan"])
    assert listed.exit_code == 0, listed.output
    header, *rows = listed.stdout.splitlines()
    assert header.split()[:7] == ["NAME", "SIZE", "QUANT", "MODE", "CONTEXT", "TOK/S", "DRAFT"]
    for row in rows:  # resident models: no draft searched for (speculative/auto_draft.py)
        assert "full-resident" in row and float(row.split()[6]) > 0 and row.split()[8] == "-"


def test_hypura_cli_by_name(store):
    cmd = [sys.executable, "-m", "hypura.cli.completion", "-m", "someone/smol:tiny", "-no-cnv", "-p", "Hello",
           "-n", "4", "--temp", "0", "-t", "1", "-c", "64"]
    p = subprocess.run(cmd, capture_output=True, timeout=300, env=os.environ.copy())
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    p = subprocess.run([*cmd[:4], "smoll", *cmd[5:]], capture_output=True, timeout=300, env=os.environ.copy())
    assert p.returncode != 0 and b"close matches: smol:latest" in p.stderr and b"Traceback" not in p.stderr


@pytest.mark.parametrize("args", [["serve", "-m", "smoll", "--port", "0"], ["inspect", "smoll"]])
def test_hypura_commands_say_close_matches(store, args):
    p = subprocess.run([sys.executable, "-m", "hypura.cli.main", *args], capture_output=True, timeout=120,
                       env=os.environ.copy(), text=True)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].endswith("close matches: smol:latest")
