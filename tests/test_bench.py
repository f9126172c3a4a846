"""`hypura bench`: llama-bench-style runs with stats and the bound, and one-line errors."""

import json
import subprocess
import sys

import pytest


def _bench(*args):
    return subprocess.run([sys.executable, "-m", "hypura.cli.main", "bench", *args],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_bench_streams_and_reports_beside_the_bound(smollm2_path, tmp_path):
    out = tmp_path / "bench.json"
    # -c: an unset context would get 4096 cells, as hypura-cli's, and their KV cache does not fit 250 MiB
    r = _bench(str(smollm2_path), "--ram", "250MiB", "-c", "256", "-p", "16", "-n", "4", "-r", "2", "-t", "1",
               "--json", str(out))
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert len(res["decode_tok_s"]["runs"]) == 2 and res["decode_tok_s"]["median"] > 0
    assert len(res["prefill_tok_s"]["runs"]) == 2
    decode = res["stats"]["decode"]
    assert decode["tokens"] == 8  # the warm-up is not counted
    assert decode["streamed_bytes_per_token"]["disk"] > 0  # this budget streams layers from disk
    assert res["bound"]["decode_tok_s"] > 0 and res["bound_ratio"] > 0
    mem = res["stats"]["memory"]
    assert mem["rss_peak"] >= mem["rss"] > 0 and mem["budget"]["ram"] == 250 * 2**20 and mem["gpu_used"] is None
    assert "decode" in r.stdout and "bound" in r.stdout and "RSS peak" in r.stdout


@pytest.mark.slow
def test_bench_of_a_prompt_only_reports_without_a_decode_ratio(smollm2_path):
    r = _bench(str(smollm2_path), "--ram", "250MiB", "-c", "256", "-p", "16", "-n", "0", "-r", "1", "-t", "1")
    assert r.returncode == 0, r.stderr
    assert "prefill" in r.stdout and "bound" in r.stdout and "measured/bound" not in r.stdout


@pytest.mark.slow
def test_bench_errors_are_one_line(smollm2_path):
    r = _bench(str(smollm2_path), "--plan", "p.json", "--ram", "1GiB")
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "not both" in r.stderr
    r = _bench("/nonexistent.gguf")
    assert r.returncode == 1 and "no such file" in r.stderr


@pytest.mark.slow
def test_bench_runs_expert_caches_and_bounds_them(tiny_qwen3moe, tmp_path):
    out = tmp_path / "bench.json"
    r = _bench(str(tiny_qwen3moe), "--expert-slots", "6", "-p", "8", "-n", "8", "-r", "2", "-t", "1", "--json", str(out))
    assert r.returncode == 0, r.stderr
    ex = json.loads(out.read_text())["stats"]["experts"]
    # runs x (decode tokens x k x MoE layers + the prompt's last token at the last layer, where llama.cpp
    # keeps only the rows it needs logits for: a one-token batch, which the cache serves)
    assert ex["accesses"] == 2 * (8 * 4 * 2 + 1 * 4 * 1)
    assert "experts: 6 slots x 2 layers" in r.stdout
    assert _bench(str(tiny_qwen3moe), "--expert-slots", "-1").stderr.strip() == "error: --expert-slots -1 needs --gpu-mem"


def test_the_expert_cache_bound_adds_gpu_reads_and_measured_loads(tiny_qwen3moe):
    from hypura.speed.bound import expert_cache_bound
    from hypura.modelfile import read_header
    from hypura.plan.cost import Rates

    h = read_header(tiny_qwen3moe)
    rates = Rates(cpu_read=1e9, disk_read=1e9, gpu_read=1e12, link=1e10)
    weights = sum(t.nbytes / (4 if "_exps" in t.name else 1) for t in h.tensors if t.name != "token_embd.weight")
    b = expert_cache_bound(h, rates, {"accesses": 10 * 4 * 2, "layers": 2, "loaded_bytes": {"demand": 5e6, "prefetch": 0}})
    assert b["seconds_per_token"]["gpu"] == pytest.approx(weights / 1e12)  # k / E = 4 / 16 of the experts
    assert b["seconds_per_token"]["link"] == pytest.approx(5e5 / 1e10)  # 5 MB over 10 tokens
    assert expert_cache_bound(h, Rates(cpu_read=1e9, disk_read=1e9), {"accesses": 1}) is None  # no GPU


class _TokenLog:
    """Stands in for a loaded model: logs the tokens bench decodes."""

    def __init__(self):
        self.batches = []
        self.context = self  # its KV cache's clear()

    def n_vocab(self):
        return 1000

    def decode_tokens(self, toks, decode=None):
        self.batches.append(list(toks))
        return True

    def clear(self):
        pass

    def stats(self, reset=False):
        return {}

    def probe_disk(self, seconds):  # no experts on disk
        return None


def test_bench_seeds_give_other_tokens_so_recorded_routing_can_leave_the_measured_ones_out():
    from hypura.speed.single import BenchSettings, run_bench

    def decoded(seed, n_prompt, n_gen):
        llm = _TokenLog()
        run_bench(llm, None, BenchSettings(n_prompt, n_gen, 1, 1, seed))
        return llm.batches

    prompt = decoded(1, 64, 0)[-1]  # a recording run's prompt
    measured = [b[0] for b in decoded(0, 0, 16)[2:]]  # the decode after the 2 warm-up tokens
    assert measured == decoded(0, 64, 0)[-1][:16]  # the same seed decodes its prompt's first tokens
    assert prompt[:16] != measured  # another seed: another sequence


def test_a_bound_is_never_beaten_and_a_run_without_a_plan_has_one(smollm2_path):
    from hypura.speed.bound import bound, honest
    from hypura.modelfile import read_header
    from hypura.plan import rates_for
    from hypura.profile import quick_profile

    b = bound(read_header(smollm2_path), None, rates_for(quick_profile()), 1, on_gpu=False)
    assert b["decode_tok_s"] > 0 and b["limit"] == "cpu" and b["placement"] == "resident"
    assert honest(b, b["decode_tok_s"] / 2) == b
    beaten = honest(b, 2 * b["decode_tok_s"])
    assert beaten["decode_tok_s"] == 2 * b["decode_tok_s"] and beaten["profile_bound_tok_s"] == b["decode_tok_s"]
    assert "beaten by this run" in beaten["limit"]


def test_bench_without_budgets_runs_the_default_path_and_prints_its_bound(smollm2_path):
    r = _bench(str(smollm2_path), "-p", "8", "-n", "4", "-r", "1", "-t", "1")
    assert r.returncode == 0, r.stderr
    assert "hypura: fits: llama.cpp's placement" in r.stderr and "context  8192" in r.stderr
    assert "bound" in r.stdout and "measured/bound" in r.stdout


@pytest.mark.slow
def test_bench_peak_rss_stays_within_a_tight_ram_budget(smollm2_path, tmp_path):
    """The RAM budget holds the whole process, not only the plan's tensors: the plan reserves the
    process's own memory (knobs.PROCESS_RAM) and the streaming readers' buffers, and disk reads land in the
    plain host slots themselves (no whole-tensor copy beside them)."""
    from hypura.plan import knobs

    out = tmp_path / "bench.json"
    r = _bench(str(smollm2_path), "--ram", "250MiB", "-c", "256", "-p", "16", "-n", "4", "-r", "1", "-t", "1",
               "--json", str(out))
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["stats"]["decode"]["streamed_bytes_per_token"]["disk"] > 0  # this budget streams from disk
    mem = res["stats"]["memory"]
    assert mem["rss_peak"] <= mem["budget"]["ram"] == 250 * 2**20
    inspect = subprocess.run([sys.executable, "-m", "hypura.cli.main", "inspect", str(smollm2_path), "--ram", "250MiB",
                              "-c", "256"], capture_output=True, text=True, timeout=60)
    assert inspect.returncode == 0, inspect.stderr
    line = next(x for x in inspect.stdout.splitlines() if x.startswith("overhead "))
    assert "of the RAM budget reserved for the process itself" in line
    assert float(line.split()[1]) >= knobs.PROCESS_RAM / 2**20  # more with more than one streaming reader


def test_one_prompt_token_and_a_sweep_run_as_llama_bench_runs_them():
    from hypura.speed.single import BenchSettings, run_bench

    llm = _TokenLog()
    out = run_bench(llm, None, BenchSettings((1,), 0, 1, 1))  # -p 1 -n 0: no batch of 0 tokens
    assert all(llm.batches) and out["prefill_tok_s"]["median"] > 0 and not out["decode_tok_s"]
    llm = _TokenLog()
    out = run_bench(llm, None, BenchSettings((1, 2, 4), 2, 2, 1))  # -p 1,2,4: a pass of each size, r times
    assert [row["n_prompt"] for row in out["prefill_sweep"]] == [1, 2, 4]
    assert [len(b) for b in llm.batches[3:]] == [1, 2, 4, 1, 1] * 2  # after the warm-up: the passes, then decode
    assert all(row["pass_s"]["median"] > 0 for row in out["prefill_sweep"])


def test_sweeps_print_a_row_a_size_as_llama_bench(smollm2_path, tmp_path):
    out = tmp_path / "bench.json"
    r = _bench(str(smollm2_path), "-p", "1,2,4,8", "-n", "2,4", "-r", "2", "-t", "1", "--json", str(out))
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line[:2] in ("pp", "tg")}
    assert list(rows) == ["pp1", "pp2", "pp4", "pp8", "tg2", "tg4"]
    assert all("s a pass" in rows[f"pp{n}"] for n in (1, 2, 4, 8)) and "s a token" in rows["tg4"]
    res = json.loads(out.read_text())
    passes = [row["pass_s"]["median"] for row in res["prefill_sweep"]]
    assert [row["n_prompt"] for row in res["prefill_sweep"]] == [1, 2, 4, 8] and min(passes) > 0
    assert [row["n_gen"] for row in res["decode_sweep"]] == [2, 4] and res["decode_tok_s"]["median"] > 0
    assert res["stats"]["decode"]["tokens"] == 2 * (2 + 4)  # each size r times, the warm-up not counted
    assert "measured/bound" in r.stdout  # the longest decode against the bound


def test_one_prompt_token_without_decode_runs_as_llama_bench_runs_pp1(gemma_path):
    r = _bench(str(gemma_path), "-p", "1", "-n", "0", "-r", "1", "-t", "1")
    assert r.returncode == 0, r.stderr
    assert "prefill" in r.stdout and "tok/s" in r.stdout and "decode " not in r.stdout
    r = _bench(str(gemma_path), "-p", "4", "-n", "2,4", "--parallel", "1,2", "-r", "1", "-t", "1")
    assert r.returncode == 1 and "--parallel takes one -p and one -n" in r.stderr


@pytest.mark.slow
def test_bench_measures_speculation_beside_plain_decode(smollm2_path, tmp_path):
    out = tmp_path / "spec.json"
    # n-gram drafting on the copy-heavy prompt; the draft model drafting for itself within a RAM budget
    r = _bench(str(smollm2_path), "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "-n", "32",
               "-r", "1", "-t", "1", "-c", "512", "--json", str(out))
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    # identical up to the plain run's first near-tie (where the CPU's kernels, not the code, pick the token)
    assert res["greedy_identical"] and res["greedy_compared"] >= 1 and len(res["plain_gaps"]) == 32
    assert res["tokens_per_pass"]["median"] > 1 and 0 < res["acceptance"]["median"] <= 1
    assert res["spec_tok_s"]["median"] > 0 and res["pass_ms_by_tokens"] and res["bound"]["decode_tok_s"] > 0
    assert "speculative ngram-simple" in r.stdout and "tokens, acceptance" in r.stdout and "bound" in r.stdout
    r = _bench(str(smollm2_path), "-md", str(smollm2_path), "--ram", "1GiB", "-n", "16", "-r", "1", "-t", "1",
               "-c", "512", "--json", str(out))
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["greedy_identical"] and res["draft_on_gpu"] is False and res["acceptance"]["median"] == 1.0
    assert "the draft in RAM" in r.stdout


def test_bench_speculation_errors_are_one_line(smollm2_path):
    r = _bench(str(smollm2_path), "--spec-type", "ngram-simple", "--parallel", "1,4")
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "one sequence" in r.stderr
    r = _bench(str(smollm2_path), "-md", "no-such-draft.gguf")
    assert r.returncode == 1 and "failed to open file 'no-such-draft.gguf'" in r.stderr


def test_greedy_output_is_compared_up_to_the_first_near_tie():
    """The speculative bench's 'identical' holds where the kernels cannot decide: up to the plain run's first
    top-two gap under NEAR_TIE, all tokens where there is none."""
    from hypura.speed.speculative import NEAR_TIE, compare_greedy
    from hypura.speculative.generate import Run

    decided = Run([1, 2, 3, 4], 0.0, 0.0, (5.0, 4.0, 3.0, 2.0))
    tie = Run([1, 2, 3, 4], 0.0, 0.0, (5.0, NEAR_TIE / 2, 3.0, 2.0))
    assert compare_greedy(decided, Run([1, 2, 3, 4], 0.0, 0.0)) == (True, 4)
    assert compare_greedy(decided, Run([1, 2, 3, 9], 0.0, 0.0)) == (False, 4)
    assert compare_greedy(decided, Run([1, 2, 3], 0.0, 0.0)) == (False, 4)  # ended early
    assert compare_greedy(tie, Run([1, 7, 8, 9], 0.0, 0.0)) == (True, 1)  # parted at the near-tie
    assert compare_greedy(tie, Run([5, 2, 3, 4], 0.0, 0.0)) == (False, 1)
