"""Every crash class found by the fuzzer (tests/fuzz) and in issue #23, as a deterministic file: through
hypura-cli and hypura.Llama (forked children, tests/fuzz/runner.py) each gives one clean error line
naming the field, or runs, with bounded memory."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hypura.errors import ModelFileError
from hypura.modelfile import read_header
from fuzz.cases import CASES
from fuzz.gguf_model import parse
from fuzz.runner import MAX_LINE

MEMORY = 1 << 30  # peak RSS of a child allowed for a valid file (a 2-billion context once took 8 GB)


@pytest.fixture(scope="module")
def seeds(smollm2_path, tiny_llama, tiny_qwen3moe):
    raw = {"smollm2": smollm2_path.read_bytes(), "tiny-llama": tiny_llama.read_bytes(),
           "tiny-qwen3moe": tiny_qwen3moe.read_bytes()}
    return {name: parse(data) for name, data in raw.items()}


@pytest.fixture(scope="module")
def case_files(seeds, tmp_path_factory):
    d = tmp_path_factory.mktemp("cases")
    files = {}
    for name, (seed, make, _) in CASES.items():
        files[name] = d / f"{name}.gguf"
        files[name].write_bytes(make(seeds[seed]))
    return files


@pytest.fixture(scope="module")
def outcomes(case_files, tmp_path_factory):
    """Every case through both paths, in one fork server."""
    out = tmp_path_factory.mktemp("runs") / "outcomes.jsonl"
    names = list(case_files)
    run = subprocess.run([sys.executable, "-m", "tests.fuzz.run", "--quiet", "--json", str(out), "--files"]
                         + [str(case_files[n]) for n in names], capture_output=True, text=True, timeout=900,
                         cwd=Path(__file__).resolve().parents[1])
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    by_file = {}
    for line in out.read_text().splitlines():
        rec = json.loads(line)
        by_file.setdefault(rec["file"], {})[rec["path"]] = rec
    return {n: by_file[str(case_files[n])] for n in names}


@pytest.mark.parametrize("name", list(CASES))
def test_each_crash_class_is_a_clean_error_on_both_paths(name, outcomes, case_files):
    words = CASES[name][2]
    for path, rec in outcomes[name].items():
        if words is None:
            assert rec["outcome"] == "ran", rec
            assert rec["peak_rss"] < MEMORY, rec
            continue
        assert rec["outcome"] == "clean", rec
        assert words in rec["detail"] and str(case_files[name]) in rec["detail"], rec
        assert len(rec["detail"]) <= MAX_LINE


@pytest.mark.parametrize("name", [n for n, (_, _, words) in CASES.items() if words and "not found" not in words
                                  and "wrong shape" not in words and "chat_template" not in words])
def test_read_header_names_the_field_before_llama_cpp_reads_the_file(name, case_files):
    with pytest.raises(ModelFileError, match=None) as info:
        read_header(case_files[name])
    message = str(info.value)
    assert CASES[name][2] in message and "\n" not in message and message.isprintable()
    assert len(message) < 100 + len(str(case_files[name])) + 150  # a 62-million character name is cut short


def test_valid_odd_files_pass_read_header(case_files):
    assert any(t.ggml_type == 42 for t in read_header(case_files["q2_0-weight"]).tensors)
    assert read_header(case_files["context-length-2e9"]).get("context_length") == 2_000_000_000
