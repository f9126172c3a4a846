"""What `hypura-cli` reports on stderr besides generated text: llama.cpp's own log lines (routed
through our console with llama-completion's verbosity rules), common_perf_print's timings, and
Hypura's --stats (placement, speed, streamed bytes per tier, stalls, link rates, the plan's prediction)."""

from __future__ import annotations

import ctypes
import math
from collections import Counter

from hypura.cli.completion.console import Console
from hypura.cli.completion.common_params import Settings
from hypura.runtime.stats import describe

import llama_cpp  # noqa: E402  (imported after hypura's engine: our library)

_log_callback = None  # kept alive: llama.cpp holds the pointer


def route_llama_logs(con: Console) -> None:
    """llama.cpp's log lines through `con`: library INFO counts as "trace" (shown from -lv 4 or
    -v), WARN and ERROR are shown by default (common_log_default_callback)."""
    global _log_callback
    levels = {0: 0, 1: 5, 2: 4, 3: 2, 4: 1, 5: 4}  # ggml_log_level -> verbosity (common_log_get_verbosity)

    @llama_cpp.llama_log_callback
    def callback(level, text, user_data):
        # GGML_LOG_LEVEL_NONE would go to stdout in llama.cpp; libllama logs nothing at that level
        con.log(levels.get(level, 4), text.decode("utf-8", "replace"), prefix=level != 5)

    _log_callback = callback
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))


def _div(a: float, b: float) -> float:
    """C's float division (x/0 is inf or nan), for timings printed like common_perf_print."""
    if b:
        return a / b
    return float("nan") if a == 0 else math.copysign(float("inf"), a)


def _per(t_ms: float, n: int) -> str:
    return f"{_div(t_ms, n):8.2f} ms per token, {_div(1e3, t_ms) * n:8.2f} tokens per second"


def plan_source(llm, s: Settings) -> str:
    """Which plan ran: a file, one made from budgets, one the default path made, or none (llama.cpp's)."""
    plan, decision = getattr(llm, "plan", None), getattr(llm, "fit_decision", None)
    if plan is None:
        return "none (llama.cpp's placement" + (", fits the free memory)" if decision is not None else ")")
    what = (f"file {s.plan}" if s.plan else "made from the budgets" if s.gpu_mem or s.ram
            else "made by --fit from the free memory")
    return f"{what}: {plan.mode}, context {plan.n_ctx}"


def print_perf(con: Console, llm, chain, s: Settings, model_path: str) -> None:
    """common_perf_print, then Hypura's --stats."""
    d = llama_cpp.llama_perf_context(llm.ctx)
    ds = llama_cpp.llama_perf_sampler(chain)
    con.inf(f"common_perf_print:    samplers time = {ds.t_sample_ms:10.2f} ms / {ds.n_sample:5d} tokens\n")
    con.inf(f"common_perf_print:        load time = {d.t_load_ms:10.2f} ms\n")
    con.inf(f"common_perf_print: prompt eval time = {d.t_p_eval_ms:10.2f} ms / {d.n_p_eval:5d} tokens "
            f"({_per(d.t_p_eval_ms, d.n_p_eval)})\n")
    con.inf(f"common_perf_print:        eval time = {d.t_eval_ms:10.2f} ms / {d.n_eval:5d} runs   "
            f"({_per(d.t_eval_ms, d.n_eval)})\n")
    con.inf(f"common_perf_print:    graphs reused = {d.n_reused:10d}\n")
    if not s.stats:
        return
    placement = getattr(llm, "placement", None) or {}
    tiers = Counter(getattr(p.tier, "name", str(p.tier)).lower() for p in placement.values())
    buffers = Counter(llm.tensor_buffer(name) or "none" for name in placement) if hasattr(llm, "tensor_buffer") else {}
    by_tier = ", ".join(f"{tier} {n}" for tier, n in sorted(tiers.items())) or "n/a"
    by_buffer = ", ".join(f"{buf} {n}" for buf, n in sorted(buffers.items())) or "n/a"
    lines = [
        f"hypura: model {model_path}",
        f"hypura: tensors: {len(placement)}; placement policy: {by_tier}; buffers: {by_buffer}",
        f"hypura: budgets: gpu-mem {s.gpu_mem or 'auto'}, ram {s.ram or 'auto'}; plan {plan_source(llm, s)}",
        f"hypura: prompt {_div(1e3 * d.n_p_eval, d.t_p_eval_ms):.2f} tok/s, "
        f"decode {_div(1e3 * d.n_eval, d.t_eval_ms):.2f} tok/s",
    ]
    if hasattr(llm, "stats"):
        lines += [f"hypura: {line}" for line in describe(llm.stats())]
    con.stderr.write("\n".join(lines) + "\n")  # --stats is asked for: shown even with --log-disable
    con.stderr.flush()
