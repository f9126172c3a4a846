"""`hypura-cli --spec-type ... / -md ... [--spec-tree N]`: greedy stdout byte for byte the vendored llama-completion's
without speculation, up to one-token decoding's first near-tie (tests/greedy.py: a pass's kernels are not
one token's, and a near-tie is the CPU's to decide); --stats reports the passes; a draft with another
vocabulary is refused in one line."""

import subprocess
import sys

import pytest

from greedy import decided_text, greedy
from test_cli import HYPURA_CLI, TIMEOUT, _pair, llama_completion  # noqa: F401  (fixture)
from test_engine_speculative import PROMPTS

COPY = PROMPTS[0]  # a count, then the same count again: decided for long, and what n-gram drafters find
BASE = ["--temp", "0", "-no-cnv", "-t", "1", "-c", "512", "-p", COPY]
N_GEN = 48


@pytest.fixture(scope="module")
def one_token(smollm2_path):
    """COPY's greedy continuation, one token a decode, with its near-ties (llama-completion's flash attention)."""
    from hypura import Llama

    llm = Llama(str(smollm2_path), n_ctx=512, n_threads=1, n_threads_batch=1, flash_attn=True, verbose=False)
    try:
        return greedy(llm, llm.tokenize(COPY.encode()), N_GEN)
    finally:
        llm.close()


@pytest.mark.parametrize("spec", [["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "2"],
                                  ["--spec-type", "prompt-lookup", "--spec-draft-n-max", "8"],
                                  ["-md", "SELF"], ["-md", "SELF", "--spec-tree", "4"]])
def test_greedy_stdout_is_llama_completions(spec, one_token, llama_completion, smollm2_path):  # noqa: F811
    spec = [str(smollm2_path) if a == "SELF" else a for a in spec]
    base = ["-n", str(N_GEN), *BASE]
    ref, hyp = _pair([str(llama_completion), "-m", str(smollm2_path), *base],
                     HYPURA_CLI + ["-m", str(smollm2_path), *base, *spec, "--stats"])
    assert ref[0] == 0 and hyp[0] == 0, hyp[2][-2000:]
    decided = COPY.encode() + decided_text(one_token, at_least=20)  # stdout: the prompt, then the generated text
    assert ref[1].startswith(decided) and hyp[1].startswith(decided), (ref[1], hyp[1])
    if one_token.all_decided:
        assert hyp[1] == ref[1]
    line = next(x for x in hyp[2].splitlines() if x.startswith("hypura: speculative:") and "tokens per pass" in x)
    tokens_per_pass = float(line.split(" tokens per pass")[0].split()[-1])
    assert tokens_per_pass > 1.0, line


def test_foreign_vocabulary_draft_refused(smollm2_path, gemma_path):
    p = subprocess.run(HYPURA_CLI + ["-m", str(smollm2_path), "-md", str(gemma_path), "-n", "4", "-no-cnv",
                                     "-p", "hi", "-t", "1"], capture_output=True, timeout=TIMEOUT)
    err = p.stderr.decode()
    assert p.returncode == 1 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("error: draft model") and "vocabulary" in err


def test_spec_flags_checked():
    p = subprocess.run([sys.executable, "-m", "hypura.cli.completion", "--spec-type", "draft-simple", "-p", "x"],
                       capture_output=True, timeout=TIMEOUT)
    assert p.returncode == 1
    assert p.stderr.decode().strip().splitlines() == [
        'error while handling argument "--spec-type": --spec-type draft-simple needs a draft model (-md FNAME)']
    p = subprocess.run([sys.executable, "-m", "hypura.cli.completion", "--spec-type", "ngram-simple",
                        "--spec-tree", "4", "-p", "x"], capture_output=True, timeout=TIMEOUT)
    assert p.returncode == 1
    assert p.stderr.decode().strip().splitlines() == [
        'error while handling argument "--spec-tree": --spec-tree N takes a draft model (-md FNAME) and 2 <= N <= 64 '
        'branches']
    p = subprocess.run([sys.executable, "-m", "hypura.cli.completion", "--spec-type", "ngram-simple", "--spec-pass-ms",
                        "1:40,2", "-p", "x"], capture_output=True, timeout=TIMEOUT)
    assert p.returncode == 1
    assert p.stderr.decode().strip().splitlines() == [
        'error while handling argument "--spec-pass-ms": expected N:MS[,N:MS...], not \'1:40,2\'']
