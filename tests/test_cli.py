"""`hypura-cli` against the vendored `llama-completion` built from the same llama.cpp source.

The oracle is the C tool itself: for the same flags, stdout must be byte-for-byte the same (the
echoed prompt, the generated text, " [end of text]", "> " prompts, "EOF by user", the final
blank lines). Each pair of runs goes in parallel, one thread each (-t 1): two tools spinning two
OpenMP threads each on a 2-core machine run 50x slower.
"""

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

HYPURA_CLI = [sys.executable, "-m", "hypura.cli.completion"]
TIMEOUT = 300


@pytest.fixture(scope="session")
def llama_completion(llama_tools_dir) -> Path:
    """The vendored llama-completion: $HYPURA_LLAMA_COMPLETION, else beside our libllama."""
    explicit = os.environ.get("HYPURA_LLAMA_COMPLETION")
    path = Path(explicit) if explicit else llama_tools_dir / "llama-completion"
    if not path.is_file():  # the build makes it beside libllama: its absence is a broken build, not a machine's limit
        pytest.fail(f"no llama-completion at {path}: ./build.sh builds it beside libllama "
                    "(or set HYPURA_LLAMA_COMPLETION)")
    return path


def _run(cmd, stdin=b""):
    p = subprocess.run(cmd, input=stdin, capture_output=True, timeout=TIMEOUT)
    return p.returncode, p.stdout, p.stderr.decode("utf-8", "replace")


def _pair(ref_cmd, hyp_cmd, stdin=b""):
    with ThreadPoolExecutor(2) as pool:
        ref = pool.submit(_run, ref_cmd, stdin)
        hyp = pool.submit(_run, hyp_cmd, stdin)
        return ref.result(), hyp.result()


def _assert_same(ref, hyp):
    assert ref[0] == 0, f"llama-completion failed:\n{ref[2][-2000:]}"
    assert hyp[0] == 0, f"hypura-cli failed:\n{hyp[2][-2000:]}"
    assert "Traceback" not in hyp[2]
    assert hyp[1] == ref[1]


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory) -> Path:
    # escapes are processed in -f prompts too; one trailing newline is dropped, as llama.cpp does
    path = tmp_path_factory.mktemp("cli") / "prompt.txt"
    path.write_bytes(b'Once upon a time,\\tthere was a \\"dragon\\" who\n')
    return path


# (id, model, flags for both tools, hypura-only flags, llama-completion-only flags, stdin)
CASES = [
    # the default model when -m is absent (hypura-cli gets no -m)
    ("smol-default-model", "smollm2", ["-no-cnv", "-p", "The capital of France is", "-n", "32", "--temp", "0",
                                       "-t", "1"], ["-m-"], [], b""),
    ("gemma-oneshot", "gemma", ["-no-cnv", "-p", "The capital of France is", "-n", "32", "--temp", "0", "-t", "1"],
     [], [], b""),
    # many flags at once, and a context that fills up (-n -1, -c 48: "context full ... => stopping")
    ("smol-flags-context-full", "smollm2",
     ["-no-cnv", "-p", "List three fruits:", "-n", "-1", "-c", "48", "--temp", "0", "-s", "7", "-t", "1",
      "-b", "16", "-ub", "8", "-ngl", "0", "-ot", r"blk\.0\.=CPU", "-fa", "off", "-ctk", "f32", "-ctv", "f32",
      "--top-k", "5", "--top-p", "0.9", "--min-p", "0.1", "--repeat-penalty", "1.3", "--display-prompt"],
     ["--no-mmap", "--stats"], ["-lm", "none"], b""),
    # budgets make a plan (all RAM on this CPU build): the output must not change
    ("smol-planned-budgets", "smollm2",
     ["-no-cnv", "-p", "The capital of France is", "-n", "24", "-c", "256", "--temp", "0", "-t", "1"],
     ["--gpu-mem", "0", "--ram", "4GiB", "--stats"], [], b""),
    ("gemma-file-escapes-quantized-kv", "gemma",
     ["-no-cnv", "-f", "{prompt_file}", "-e", "-n", "32", "--temp", "0", "-t", "1", "-c", "512", "-b", "32",
      "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0", "--simple-io", "--no-display-prompt"],
     ["--mmap"], ["-lm", "mmap"], b""),
    # not greedy: the same sampler chain and RNG give the same draw; model/loader flags too
    ("gemma-seeded-sampling", "gemma",
     ["-no-cnv", "-p", "Tell me a story", "-n", "32", "--temp", "0.9", "-s", "42", "--top-k", "20", "-t", "1",
      "-nr", "--no-host", "--check-tensors", "--override-kv", "tokenizer.ggml.add_bos_token=bool:false",
      "--rope-freq-base", "20000"], [], [], b""),
    ("smol-sampler-chain", "smollm2",
     ["-no-cnv", "-p", "Tell me a story", "-n", "32", "--temp", "0.7", "-s", "3", "-t", "1", "--sampler-seq", "ekyt",
      "--typical", "0.9", "--top-nsigma", "1.5", "--dynatemp-range", "0.3", "--presence-penalty", "0.5",
      "--frequency-penalty", "0.2", "--dry-multiplier", "0.5", "-l", "13+5", "-cmoe", "-ncffn", "2",
      "--rope-scaling", "linear", "--rope-scale", "2"], [], [], b""),
    # chat: system prompt + one user turn, stdin closed
    ("smol-chat-single-turn", "smollm2",
     ["-sys", "You are a terse assistant.", "-p", "Name a color.", "-cnv", "-st", "-n", "32", "--temp", "0",
      "-t", "1"], [], [], b""),
]

INTERACTIVE = [
    # conversation mode auto-enabled by the chat template; two turns from stdin, then EOF
    ("smol-conversation-stdin", "smollm2", ["-sys", "You are terse.", "-n", "16", "--temp", "0", "--simple-io",
                                            "-t", "1"], b"Hello\nWhat is 2+2?\n"),
    # classic -i with a reverse prompt: generation stops at "Q:", the next line continues it
    ("gemma-interactive-reverse-prompt", "gemma",
     ["-i", "-p", "Q: What is the capital of France?\\nA:", "-r", "Q:", "-n", "40", "--temp", "0", "--simple-io",
      "-t", "1"], b"What about Germany?\n"),
]


def _cmds(llama_completion, model, both, hyp_only, ref_only):
    hyp_model = [] if "-m-" in hyp_only else ["-m", str(model)]
    hyp_only = [a for a in hyp_only if a != "-m-"]
    ref = [str(llama_completion), "-m", str(model)] + both + ref_only
    hyp = HYPURA_CLI + hyp_model + both + hyp_only
    return ref, hyp


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_stdout_matches_llama_completion(case, llama_completion, request, prompt_file):
    _, model, both, hyp_only, ref_only, stdin = case
    model_path = request.getfixturevalue(f"{model}_path")
    both = [a.replace("{prompt_file}", str(prompt_file)) for a in both]
    ref, hyp = _pair(*_cmds(llama_completion, model_path, both, hyp_only, ref_only), stdin)
    _assert_same(ref, hyp)
    assert len(hyp[1]) > 20 and hyp[1].endswith(b"\n\n")
    assert _system_info(hyp) == _system_info(ref)
    if "--stats" in hyp_only:
        assert "hypura: tensors: " in hyp[2] and "buffers: CPU" in hyp[2] and "decode" in hyp[2]


def _system_info(run) -> list[str]:
    """The `system_info: n_threads = ...` line a run logged, after its timestamp."""
    lines = [line[line.index("system_info:"):] for line in run[2].splitlines() if "system_info:" in line]
    assert len(lines) == 1
    return lines


@pytest.mark.slow
def test_default_threads_are_llama_cpps(llama_completion, smollm2_path):
    # one after the other: two tools on every core at once run many times slower
    both = ["-no-cnv", "-p", "Hello", "-n", "1", "--temp", "0"]
    ref, hyp = (_run(cmd) for cmd in _cmds(llama_completion, smollm2_path, both, [], []))
    assert ref[0] == 0 and hyp[0] == 0
    assert _system_info(hyp) == _system_info(ref)


@pytest.mark.slow
@pytest.mark.parametrize("case", INTERACTIVE, ids=[c[0] for c in INTERACTIVE])
def test_interactive_stdin_matches_llama_completion(case, llama_completion, request):
    _, model, both, stdin = case
    model_path = request.getfixturevalue(f"{model}_path")
    ref, hyp = _pair(*_cmds(llama_completion, model_path, both, [], []), stdin)
    _assert_same(ref, hyp)
    assert hyp[1].endswith(b"EOF by user\n\n\n")


def _one_line_error(rc, out, err):
    assert rc == 1, err
    assert out == b""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, smollm2_path):
    d = tmp_path_factory.mktemp("bad")
    data = smollm2_path.read_bytes()
    (d / "not.gguf").write_bytes(b"this is not a model\n")
    (d / "truncated.gguf").write_bytes(data[: len(data) // 10])  # tensor data past the end
    (d / "header.gguf").write_bytes(data[:200])  # the header itself is cut
    return d


BAD_FILES = [
    ("missing", "missing.gguf", "no such file"),
    ("not-gguf", "not.gguf", "not a GGUF file"),
    ("truncated", "truncated.gguf", "past the end of the file"),
    ("truncated-header", "header.gguf", "truncated"),
]


@pytest.mark.parametrize("case", BAD_FILES, ids=[c[0] for c in BAD_FILES])
def test_bad_model_file_is_one_line_and_exit_1(case, bad_files, llama_completion):
    _, name, words = case
    args = ["-m", str(bad_files / name), "-no-cnv", "-p", "hi", "-n", "4"]
    ref, hyp = _pair([str(llama_completion)] + args, HYPURA_CLI + args)
    assert ref[0] == 1  # llama-completion: "unable to create context", status 1
    assert words in _one_line_error(*hyp)


BAD_ARGS = [
    # (id, argv, llama.cpp's first line of stderr)
    ("unknown-flag", ["--no-such-flag"], "error: invalid argument: --no-such-flag"),
    ("positional", ["stray"], "error: invalid argument: stray"),
    ("bad-int", ["-n", "abc"], 'error while handling argument "-n"'),
    ("missing-value", ["-c"], 'error while handling argument "-c": expected value for argument'),
    ("bad-choice", ["-fa", "sometimes"], "error: unknown value for --flash-attn: 'sometimes'"),
    ("bad-cache-type", ["-ctk", "q9_9"], "Unsupported cache type: q9_9"),
    ("bad-penalty", ["--repeat-penalty", "0"], "repeat-penalty must be finite and greater than 0"),
    ("missing-prompt-file", ["-f", "/nonexistent/prompt.txt"], "failed to open file"),
]


@pytest.mark.parametrize("case", BAD_ARGS, ids=[c[0] for c in BAD_ARGS])
def test_bad_arguments_fail_like_llama_completion(case, llama_completion, smollm2_path):
    _, argv, expected = case
    ref, hyp = _pair([str(llama_completion), "-m", str(smollm2_path)] + argv, HYPURA_CLI + argv)
    assert ref[0] == 1 and expected in ref[2]
    assert expected in _one_line_error(*hyp)


def test_llama_flags_not_supported_are_rejected_like_unknown_ones():
    rc, out, err = _run(HYPURA_CLI + ["--grammar", 'root ::= "a"', "-p", "hi"])
    assert _one_line_error(rc, out, err).startswith("error: invalid argument: --grammar (")


def test_flags_parse_with_llama_cpp_defaults_and_rules(monkeypatch):
    from hypura.cli.completion.arg import parse
    from hypura.cli.completion.common_params import SamplingSettings, Settings

    monkeypatch.delenv("LLAMA_ARG_N_PREDICT", raising=False)
    assert parse([]) == Settings()
    s = parse(["-p", r"a\nb\x41", "--n_predict", "-2", "-fa", "-ngl", "all", "-s", "-1", "-nkvo",
               "--no-mmap", "--mlock", "--temp", "-3", "-r", r"Q\t", "--in-prefix", "x"])
    assert (s.prompt, s.n_predict, s.flash_attn, s.n_gpu_layers) == (b"a\nbA", -2, True, -2)
    assert (s.kv_offload, s.load_mode, s.antiprompt, s.enable_chat_template) == (False, "mlock", (b"Q\t",), False)
    assert s.sampling.seed == 0xFFFFFFFF and s.sampling.temp == 0.0 and s.sampling.user_set == {"temp"}
    assert parse(["--no-escape", "-p", r"a\n"]).prompt == rb"a\n"
    assert parse(["-n", "12abc"]).n_predict == 12  # std::stoi reads the numeric prefix
    monkeypatch.setenv("LLAMA_ARG_N_PREDICT", "5")
    assert parse([]).n_predict == 5 and parse(["-n", "6"]).n_predict == 6
    assert SamplingSettings().samplers[0] == "penalties"


def _read_until(proc, marker: bytes, limit_s=TIMEOUT) -> bytes:
    seen = b""
    deadline = time.monotonic() + limit_s
    while marker not in seen and time.monotonic() < deadline:
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            break
        seen += chunk
    return seen


def test_streams_tokens_and_ctrl_c_exits_130(smollm2_path):
    proc = subprocess.Popen(
        HYPURA_CLI + ["-m", str(smollm2_path), "-no-cnv", "-p", "Once upon a time", "-n", "-1", "--ignore-eos",
                      "-c", "4096", "--temp", "0", "-t", "1"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        first = _read_until(proc, b"Once upon a time")
        more = os.read(proc.stdout.fileno(), 4096)  # a generated token arrives while it still runs
        assert proc.poll() is None and more
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert (first + more + out).rstrip().endswith(b"Interrupted by user")
    assert "Traceback" not in err.decode()


def test_ctrl_c_while_waiting_for_input_exits_130(smollm2_path):
    proc = subprocess.Popen(
        HYPURA_CLI + ["-m", str(smollm2_path), "-cnv", "--simple-io", "-n", "8", "--temp", "0", "-t", "1"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        assert b"> " in _read_until(proc, b"> ")
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert b"Interrupted by user" in out and "Traceback" not in err.decode()


def test_help_lists_flags_and_unsupported_ones():
    rc, out, _ = _run(HYPURA_CLI + ["-h"])
    assert rc == 0
    for flag in (b"-ngl", b"-cnv", b"--gpu-mem", b"--stats", b"--plan", b"docs/cli.md"):
        assert flag in out


def test_expert_slots_run_an_expert_cache_and_report_it(tiny_qwen3moe):
    args = ["-m", str(tiny_qwen3moe), "-p", "Hello", "-n", "8", "-no-cnv", "-t", "1", "--temp", "0"]
    rc, out, err = _run(HYPURA_CLI + args + ["--expert-slots", "6", "--stats"])
    assert rc == 0, err
    assert "hypura: experts: 6 slots x 2 layers" in err and out
    rc, out, err = _run(HYPURA_CLI + args + ["--expert-slots", "0"])
    _one_line_error(rc, out, err)
