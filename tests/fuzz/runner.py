"""Runs a model file through Hypura in a child process and says how it went.

A fork server: the process running this imports hypura, llama-cpp-python and the CLI once (it
must not have run llama.cpp itself: OpenMP's thread pool does not survive a fork), then forks a
child per case and path, so an abort or a segfault is the child's and is attributed to its case.

Paths: "cli" is `hypura-cli -m CASE -p hi -n 2 -no-cnv -c 256 -t 1`; "llama" is `Llama(CASE, n_ctx=256)`
(one thread) and a two-token completion; "budget" is the same under budgets that stream part of the weights from
disk (`gpu_mem=0, ram=BUDGET_BASE + half the file`), planned from the cached machine profile.
Outcomes: clean (one error line, a HypuraError / ModelFileError), ran, crash (killed by a signal or
an odd exit), traceback (any other exception), memory (peak RSS above MEMORY_LIMIT), hang (still
running after the timeout), long (an error line longer than MAX_LINE or not printable). Both paths
run one thread (-t 1): on shared cores, OpenMP workers spinning against other work made a tiny
model's token take 0.8 s instead of 1 ms.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import time
import traceback
from dataclasses import dataclass

MEMORY_LIMIT = 4 * 2**30  # bytes of peak RSS that count as a blow-up (the threshold)
ADDRESS_LIMIT = 32 * 2**30  # RLIMIT_AS of a child: a runaway allocation fails instead of taking the machine
MAX_LINE = 400  # characters of an error line before it counts as unclear
CLI_ARGS = ["-p", "hi", "-n", "2", "-no-cnv", "-c", "256", "-t", "1"]
OUTCOMES = ("clean", "ran", "crash", "traceback", "memory", "hang", "long")
_EXIT_RAN, _EXIT_CLEAN, _EXIT_TRACEBACK = 0, 3, 4
# hypura-cli's catch-all prints an unexpected exception as "error: TypeError: ..." (hypura.cli.completion.main)
_UNEXPECTED = re.compile(r"^error: [A-Z]\w*(Error|Exception|Interrupt|Exit): ")


@dataclass(frozen=True)
class Result:
    path: str
    outcome: str
    detail: str  # the error line, the signal, or the traceback's last line
    seconds: float
    peak_rss: int  # bytes


BUDGET_BASE = 258 * 2**20  # RAM the planner reserves at -c 256 besides weights (compute buffer, KV cache)


def prepare(paths=("cli", "llama")) -> None:
    """Import what children run, once, in the server (before any fork)."""
    import hypura  # noqa: F401  first: loads our library before numpy
    import hypura.cli.completion  # noqa: F401
    import hypura.cli.completion.completion  # noqa: F401
    import hypura.llama  # noqa: F401

    if "budget" in paths:
        from hypura.profile.store import load_cached

        if load_cached() is None:  # measuring in each child would take minutes (and run llama.cpp)
            raise SystemExit("the budget path plans from the cached machine profile: run `hypura profile` first")


def _child_cli(path: str) -> None:
    from hypura.cli.completion import main

    try:
        main(["-m", path] + CLI_ARGS)
    except SystemExit as e:
        os._exit(e.code if isinstance(e.code, int) else 1)
    os._exit(0)


def _child_llama(path: str, report, budget: bool = False) -> None:
    from hypura.errors import HypuraError
    from hypura.llama import Llama

    kwargs = dict(gpu_mem=0, ram=BUDGET_BASE + os.path.getsize(path) // 2) if budget else {}
    try:
        llm = Llama(path, n_ctx=256, n_threads=1, verbose=False, **kwargs)
        llm("hi", max_tokens=2)
    except HypuraError as e:
        report.write(f"{type(e).__name__}: {e}")
        report.flush()
        os._exit(_EXIT_CLEAN)
    except BaseException:  # noqa: BLE001 - what the fuzzer looks for
        report.write(traceback.format_exc())
        report.flush()
        os._exit(_EXIT_TRACEBACK)
    os._exit(_EXIT_RAN)


def run(path: str, which: str, workdir: str, timeout: float) -> Result:
    """Fork a child running `which` on the model file at `path`; its stdout/stderr go to workdir."""
    out, err, rep = (os.path.join(workdir, f"{which}.{n}") for n in ("out", "err", "report"))
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        try:
            resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_LIMIT, ADDRESS_LIMIT))
            for fd, name in ((1, out), (2, err)):
                f = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(f, fd)
                os.close(f)
            with open(rep, "w") as report:
                if which == "cli":
                    _child_cli(path)
                _child_llama(path, report, budget=which == "budget")
        finally:
            os._exit(70)
    status, peak, outcome = _wait(pid, timeout)
    seconds = time.monotonic() - t0
    return _classify(which, status, peak, outcome, out, err, rep, seconds)


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _wait(pid: int, timeout: float):
    """(wait status, peak RSS, None or 'hang'/'memory' when the child was killed for it)."""
    deadline, peak, poll = time.monotonic() + timeout, 0, 0.002
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return status, max(peak, usage.ru_maxrss * 1024), None
        peak = max(peak, _rss(pid))
        reason = "memory" if peak > MEMORY_LIMIT else "hang" if time.monotonic() > deadline else None
        if reason:
            os.kill(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            return status, max(peak, usage.ru_maxrss * 1024), reason
        time.sleep(poll)
        poll = min(poll * 2, 0.05)


def _tail(name: str, limit: int = 4000) -> str:
    try:
        with open(name, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _classify(which, status, peak, killed, out, err, rep, seconds) -> Result:
    def result(outcome, detail):
        return Result(which, outcome, detail[:300], seconds, peak)

    if killed:
        return result(killed, f"killed after {seconds:.1f} s, peak RSS {peak / 2**30:.2f} GiB")
    if peak > MEMORY_LIMIT:
        return result("memory", f"peak RSS {peak / 2**30:.2f} GiB")
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return result("crash", f"{signal.Signals(sig).name}: {_last_line(_tail(err))}")
    code = os.WEXITSTATUS(status)
    stderr = _tail(err)
    if "Traceback (most recent call last)" in stderr:
        return result("traceback", _last_line(stderr))
    if which != "cli":
        report = _tail(rep, 100_000)
        if code == _EXIT_RAN:
            return result("ran", "")
        if code == _EXIT_CLEAN:
            return _clean_line(result, report)
        if code == _EXIT_TRACEBACK:
            return result("traceback", _last_line(report))
        return result("crash", f"exit {code}: {_last_line(stderr)}")
    if code == 0:
        return result("ran", "")
    line = _last_line(stderr)
    if code == 1 and line.startswith("error: "):
        if _UNEXPECTED.match(line):
            return result("traceback", line)
        return _clean_line(result, line)
    return result("crash", f"exit {code}: {line}")


def _clean_line(result, line: str) -> Result:
    if "\n" in line.strip() or len(line) > MAX_LINE or not line.strip().isprintable():
        return result("long", f"{len(line)} characters: {line[:200]!r}")
    return result("clean", line.strip())


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""
