"""Several machines on one: two ggml-rpc-server processes on loopback, each a CPU backend held to a memory limit
(a memory cgroup where this machine lets us make one), plus this process under --ram. A model that fits none of
the three alone runs split over them: Hypura's split (hypura.plan.shares) beside vanilla llama-completion with the
same servers at the same split, its --tensor-split by hand (a few around hypura-cli's first split) and its --fit.
Hypura plans its split again in every run (it follows the servers' measured rates), so each round runs hypura-cli,
then vanilla at the split hypura-cli chose in that round: the two tools compared at one configuration.

    python3 bench/rpc_cpu.py MODEL.gguf [--server-mem 900MiB] [--ram 1400MiB] [-n 32] [--threads 1]
        [--splits '7:4,3;7:5,2;6:4,2'] [--rounds 3] [--json FILE] [--dry-run]

Every run is its own process (RPC devices stay registered for a process's life). Reported: the split, greedy
tokens equal to the local run's (compared while the top two logits are clearly apart), decode tok/s against the
split's predicted bound, vanilla's decode tok/s for each split tried (or how it failed), and each round's split
with both tools' decode tok/s at it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import hypura  # noqa: F401  first: our library loads before numpy
from hypura.bindings.library import lib_dir
from hypura.profile import rpc
from hypura.sizes import parse_size

PROMPT = "The history of the printing press begins"
# a server's own memory beside the buffers it lends: 6 MiB RSS idle (ggml-rpc-server -d CPU on the CPU VM), its
# heap and thread stacks while serving; Hypura's budget for it is its cgroup's limit less this
SERVER_PROCESS_RAM = 64 << 20
# a top-two logit gap above this is far beyond numeric noise between backends (tests/test_rpc.py)
CLEAR_GAP = 0.1

_RUN = r"""
import json, sys
import numpy as np
from hypura import Llama

model, prompt, n, threads, kw = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3]), int(sys.argv[4]), json.loads(sys.argv[5])
forced = kw.pop("forced", None)  # the local run's tokens: this run's argmax at each of them (teacher forcing)
llm = Llama(model, n_ctx=512, n_threads=threads, n_threads_batch=threads, verbose=False, logits_all=True, **kw)
tokens = llm.tokenize(prompt)
out, gaps = [], []
for i in range(n):
    llm.eval(tokens if i == 0 else [forced[i - 1] if forced else out[-1]])
    logits = np.array(llm.scores[llm.n_tokens - 1], copy=True)
    top2 = np.partition(logits, -2)[-2:]
    out.append(int(np.argmax(logits)))
    gaps.append(float(top2[1] - top2[0]))
s = llm.decision.shares
print(json.dumps({"tokens": out, "gaps": gaps,
                  "split": None if s is None else {"host_layers": s.host_layers, "layers": list(s.layers),
                  "devices": list(s.device_names()), "predicted_tok_s": s.tok_s, "limit": s.limit, "flags": s.flags(),
                  "memory": s.memory, "seconds": dict(s.seconds)}}))
llm.close()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cgroup(name: str, limit: int) -> Path | None:
    """A memory cgroup (v2, else v1) holding at most `limit` bytes, None where this machine does not let us."""
    for root, ctl in ((Path("/sys/fs/cgroup"), "memory.max"), (Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes")):
        if (root / ("cgroup.controllers" if ctl == "memory.max" else "memory.limit_in_bytes")).exists():
            cg = root / f"hypura-{name}"
            try:
                cg.mkdir(exist_ok=True)
                (cg / ctl).write_text(str(limit))
                return cg
            except OSError:
                return None
    return None


class Servers:
    """Two ggml-rpc-server processes on 127.0.0.1 with the CPU device, each in a cgroup of `limit` bytes."""

    def __init__(self, limit: int, threads: int, dry_run: bool):
        self.exe = lib_dir() / "ggml-rpc-server"
        self.limit, self.threads, self.dry_run = limit, threads, dry_run
        self.procs: list[subprocess.Popen | None] = [None, None]
        self.endpoints = [f"127.0.0.1:{_free_port()}" for _ in range(2)]
        self.limited = False
        self.restarts = 0

    def _start(self, i: int) -> None:
        port = self.endpoints[i].rsplit(":", 1)[1]
        cmd = [str(self.exe), "-H", "127.0.0.1", "-p", port, "-d", "CPU", "-t", str(self.threads)]
        cg = None if self.dry_run else _cgroup(f"rpc{i}", self.limit)
        self.limited = cg is not None
        print(f"server   {shlex.join(cmd)}" + (f"  (cgroup {cg}, {self.limit >> 20} MiB)" if cg else ""),
              file=sys.stderr)
        if self.dry_run:
            return
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if cg is not None:
            (cg / "cgroup.procs").write_text(str(proc.pid))
        self.procs[i] = proc
        rpc.wait_listening(self.endpoints[i])

    def revive(self) -> None:
        """Restart a server a run killed (its cgroup's limit, or a client that aborted)."""
        for i, p in enumerate(self.procs):
            if p is not None and p.poll() is not None:
                self.restarts += 1
                self._start(i)

    def __enter__(self):
        for i in range(2):
            self._start(i)
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            if p is not None:
                p.kill()
                p.wait()


def _python(model: str, n: int, threads: int, kw: dict, dry_run: bool) -> dict:
    cmd = [sys.executable, "-c", _RUN, model, PROMPT, str(n), str(threads), json.dumps(kw)]
    print(f"hypura   Llama({model!r}, {', '.join(f'{k}={v!r}' for k, v in kw.items())})", file=sys.stderr)
    if dry_run:
        return {}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1], "rc": p.returncode}
    return json.loads(p.stdout.strip().splitlines()[-1])


def _vanilla(model: str, n: int, threads: int, args: list[str], dry_run: bool, tool: str = "vanilla") -> dict:
    """llama-completion (or hypura-cli: tool "hypura") with `args`: its decode tok/s from the perf lines both print."""
    exe = [str(lib_dir() / "llama-completion")] if tool == "vanilla" else [sys.executable, "-m", "hypura.cli.completion"]
    cmd = [*exe, "-m", model, "-p", PROMPT, "-n", str(n), "-no-cnv", "--temp", "0",
           "-t", str(threads), "-tb", str(threads), "-c", "512", "-lv", "4", *args]
    print(f"{tool:<8} {shlex.join(cmd)}", file=sys.stderr)
    if dry_run:
        return {"args": args}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
    m = re.search(r"perf_print:\s+eval time =.*?([\d.]+) tokens per second", p.stderr)
    if p.returncode != 0 or m is None:
        tail = [line for line in p.stderr.strip().splitlines() if line.strip()][-3:]
        return {"args": args, "rc": p.returncode, "error": " | ".join(tail)}
    # where the weights went: llama.cpp's "<device> model buffer size = ... MiB" lines
    buffers = dict(re.findall(r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB", p.stderr))
    out = {"args": args, "decode_tok_s": float(m.group(1)), "model_buffers_mib": buffers}
    split = re.search(r"hypura: devices: (.*predicted ([\d.]+) tok/s.*)", p.stderr)  # hypura-cli's own split
    if split:
        out.update(split_line=split.group(1), predicted_tok_s=float(split.group(2)))
    return out


def _agree(got: list[int], want: list[int], gaps: list[float]) -> dict:
    """Teacher-forced argmax against the local run's, at every position where the local top two are clearly apart."""
    clear = [i for i, g in enumerate(gaps) if g >= CLEAR_GAP]
    return {"positions": len(gaps), "compared": len(clear), "equal": all(got[i] == want[i] for i in clear)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--server-mem", default="900MiB", help="each server's memory limit and Hypura's budget for it")
    ap.add_argument("--ram", default="1400MiB", help="this process's RAM budget (hypura --ram)")
    ap.add_argument("-n", type=int, default=32, help="greedy tokens per run")
    ap.add_argument("--threads", type=int, default=1, help="threads per process (servers included)")
    ap.add_argument("--splits", default="", help="vanilla -ngl/--tensor-split to try, 'NGL:A,B;...' (default: "
                                                 "hypura-cli's first split and its neighbours)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each hypura-cli and then llama-completion at "
                                                          "the split hypura-cli chose in it (a busy machine's noise)")
    ap.add_argument("--json")
    ap.add_argument("--dry-run", action="store_true", help="print the command lines, run nothing")
    a = ap.parse_args()
    limit = parse_size(a.server_mem)
    out: dict = {"model": a.model, "server_mem": a.server_mem, "ram": a.ram, "n": a.n, "threads": a.threads,
                 "machine": os.uname().nodename}
    out["local"] = _python(a.model, a.n, a.threads, {}, a.dry_run)
    out["local_cli"] = _vanilla(a.model, a.n, a.threads, [], a.dry_run, tool="hypura")
    out["vanilla_local"] = _vanilla(a.model, a.n, a.threads, [], a.dry_run)
    mem = ",".join([f"{(limit - SERVER_PROCESS_RAM) >> 20}MiB"] * 2)
    with Servers(limit, a.threads, a.dry_run) as servers:
        out["servers_limited"] = servers.limited
        rpc_arg = ["--rpc", ",".join(servers.endpoints)]
        hyp = _python(a.model, a.n, a.threads, {"n_gpu_layers": -1, "ram": a.ram, "rpc_servers": rpc_arg[1],
                                                "rpc_mem": mem.split(","), "forced": out["local"].get("tokens")},
                      a.dry_run)
        out["hypura"] = hyp
        if hyp.get("tokens") and out["local"].get("tokens"):
            hyp["greedy_vs_local"] = _agree(hyp["tokens"], out["local"]["tokens"], out["local"]["gaps"])
        out["rounds"] = []
        for _ in range(a.rounds):
            h = _vanilla(a.model, a.n, a.threads, rpc_arg + ["--rpc-mem", mem, "--ram", a.ram], a.dry_run,
                         tool="hypura")
            servers.revive()
            # the split of this very run: Hypura's measured server rates, and so its split, vary between runs
            same = split_flags(h["split_line"]) if "split_line" in h else ["<the split hypura-cli chose>"]
            v = (_vanilla(a.model, a.n, a.threads, rpc_arg + same, a.dry_run) if "split_line" in h or a.dry_run
                 else {"error": "hypura-cli reported no split"})
            servers.revive()
            out["rounds"].append({"split": shlex.join(same), "hypura": h.get("decode_tok_s"),
                                  "vanilla_same_split": v.get("decode_tok_s"), "predicted": h.get("predicted_tok_s"),
                                  "of_prediction": (h["decode_tok_s"] / h["predicted_tok_s"]
                                                    if "predicted_tok_s" in h else None)})
        # by hand: the first round's split and a layer more or less on each server, as a user would try them
        first = out["rounds"][0]["split"] if out["rounds"] else ""
        tries = ([["-dev", "RPC0,RPC1", "-ngl", t.split(":")[0], "-ts", t.split(":")[1]] for t in a.splits.split(";")]
                 if a.splits else _neighbours(shlex.split(first)))
        out["vanilla"] = []
        for flags in tries:
            out["vanilla"].append(_vanilla(a.model, a.n, a.threads, rpc_arg + flags, a.dry_run))
            servers.revive()
        out["vanilla_fit"] = _vanilla(a.model, a.n, a.threads, rpc_arg + ["-fit", "on"], a.dry_run)
        out["server_restarts"] = servers.restarts
    ok = [v for v in out["vanilla"] if "decode_tok_s" in v]
    out["vanilla_best"] = max(ok, key=lambda v: v["decode_tok_s"]) if ok else None
    text = json.dumps(out, indent=1)
    if a.json:
        Path(a.json).write_text(text + "\n")
    print(text)
    return 0


def split_flags(line: str) -> list[str]:
    """llama-completion's flags for the split of hypura-cli's `hypura: devices: host H + DEV N + ... of L layers`
    line, as DeviceShares.flags writes them: the devices holding layers, in order, and their layer counts."""
    m = re.match(r"host \d+((?: \+ \S+ \d+)*) of \d+ layers", line)
    if m is None:
        raise ValueError(f"not a hypura-cli devices line: {line!r}")
    shares = re.findall(r" \+ (\S+) (\d+)", m.group(1))
    if not shares:
        return ["-ngl", "0"]
    return ["-dev", ",".join(name for name, _ in shares), "-sm", "layer", "-ngl", str(sum(int(n) for _, n in shares)),
            "-ts", ",".join(n for _, n in shares)]


def _neighbours(flags: list[str]) -> list[list[str]]:
    """split_flags' split over two servers and a layer more or less on each (a user's tries by hand); (1, 1) and
    its neighbours where hypura-cli split over fewer."""
    ts = flags[flags.index("-ts") + 1].split(",") if "-ts" in flags else []
    a, b = (int(ts[0]), int(ts[1])) if len(ts) == 2 else (1, 1)
    out = []
    for da, db in ((0, 0), (1, -1), (-1, 1), (-1, 0), (0, -1)):
        x, y = a + da, b + db
        if x > 0 and y > 0:
            out.append(["-dev", "RPC0,RPC1", "-sm", "layer", "-ngl", str(x + y), "-ts", f"{x},{y}"])
    return out


if __name__ == "__main__":
    sys.exit(main())
