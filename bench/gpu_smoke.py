"""The GPU smoke: every front end over every kind of plan, on models with real per-tensor sizes, in minutes.

    python3 bench/gpu_smoke.py --dense D.gguf --moe M.gguf --draft DRAFT.gguf --bin LIBDIR [--out DIR]

D and M are layer subsets of real shapes (`hypura synth llama3.3-70b --layers 4`, `qwen3-30b-a3b --layers 4`):
each tensor as large as in the full model (a 132 MB FFN matrix, a 113 MB expert stack), which tiny models never
have. Budgets force each plan (PLANS); a pinned profile (the H200 design profile) keeps the plans the same on
any machine, the budgets standing for the smaller GPU and RAM. Every row's greedy text is compared with vanilla
llama.cpp of the same build, the whole model on the GPU (`llama-completion -ngl 99`), same prompt: the subsets
fit there. Greedy text over random weights hangs on near ties that any change of kernel decides (llama.cpp's own
micro-batch size moves it), so the models' block outputs are scaled to nothing (--block-out-scale 0.000001): the
text then follows the embeddings and the head, and a row tells a crash, an abort, a NaN or a lost request, not
the last bits. Those are the GPU tests' (tests/test_gpu_placement.py, run on the same subsets first: logits
bitwise against vanilla). `hypura bench` rows pass on a clean exit with figures. `hypura serve -kvu` rows (the
sequences share the KV cells the planner chose) pass when one request's greedy text is the same request's through
the server without -kvu. Writes smoke.md (the table) and smoke.json to --out; exit status 1 when a row fails.

    python3 bench/gpu_smoke.py --dry-run --dense TINY.gguf --moe TINY_MOE.gguf [--out DIR]

runs the -kvu rows alone on a CPU host (tiny synthetic models, CPU budgets): their own path, before a GPU machine.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

N_GEN = 8
CTX = 4096
WORDS = "the quick brown fox jumps over the lazy dog near the river bank while a small bird sings".split()
PROMPTS = {  # ~1, ~100 and ~2,100 tokens
    "1": "Hello",
    "100": " ".join(WORDS[i % len(WORDS)] for i in range(96)),
    "2100": " ".join(f"{WORDS[i % len(WORDS)]}{'.' if i % 11 == 10 else ''}" for i in range(1900)),
}
# name: (model, flags, what they force); "PLAN:ram" / "PLAN:disk": a plan file made here (forced_plan)
PLANS = {
    "resident": ("dense", [], "every layer on the GPU"),
    "dense-cpu": ("dense", ["--gpu-mem", "2GiB", "--ram", "16GiB"],
                  "RAM layers on the CPU, pinned in place: op offload copies them for prompts"),
    "dense-ram-streamed": ("dense", ["--plan", "PLAN:ram"], "every layer streamed from pinned RAM into 3 GPU slots"),
    "dense-disk-streamed": ("dense", ["--plan", "PLAN:disk"], "every layer streamed from disk into 3 GPU slots"),
    "dense-disk": ("dense", ["--gpu-mem", "2GiB", "--ram", "2GiB"], "layers read from disk into a RAM slot"),
    "moe-pinned": ("moe", ["--gpu-mem", "1GiB", "--ram", "16GiB"], "experts in pinned RAM, op offload"),
    "moe-disk": ("moe", ["--gpu-mem", "1GiB", "--ram", "1GiB"], "experts paged from disk"),
}
TIMEOUT_S = 180
KVU_PLANS = ("dense-ram-streamed", "moe-pinned")  # serve -kvu's rows: a dense streamed plan, an MoE pinned one
# --dry-run: the rows' own path on a CPU host, each plan's flags made CPU budgets (no GPU), no vanilla reference
DRY_FLAGS = ["--gpu-mem", "0", "--ram", "4GiB"]


@dataclass
class Row:
    front: str
    plan: str
    prompt: str
    result: str  # pass | FAIL | DIFFERS
    seconds: float
    detail: str = ""


def budgets_kwargs(flags: list[str]) -> dict:
    return {flags[i].lstrip("-").replace("-", "_"): flags[i + 1] for i in range(0, len(flags), 2)}


def forced_plan(model: str, tier: str, out: Path) -> str:
    """The design profile's plan with every block tensor streamed from `tier` into 3 GPU slots and computed on
    the GPU (the rest as planned, the output head on the GPU): what a 70B at 8 GiB streams, which the planner
    never picks for a 4-layer subset (holding its few layers costs no more than the slots)."""
    import dataclasses

    from hypura.plan import PlanSettings, plan_model
    from hypura.profile import resolve_profile

    def placed(t):
        if t.layer >= 0:
            return dataclasses.replace(t, tier=tier, compute="gpu")
        return dataclasses.replace(t, tier="gpu", compute="gpu") if t.name.startswith("output") else t

    plan = plan_model(model, resolve_profile("h200-design"), settings=PlanSettings(n_ctx=CTX))
    plan = dataclasses.replace(plan, tensors=tuple(map(placed, plan.tensors)), kv_tier="gpu", pool_slots=3)
    return str(plan.save(out / f"plan-{Path(model).stem}-{tier}.json"))


class Smoke:
    def __init__(self, args):
        self.args, self.rows = args, []
        self.models = {"dense": args.dense, "moe": args.moe}
        self.reference: dict[tuple[str, str], str] = {}
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.flags = {}  # plan -> its flags, plan files made
        for plan, (model, flags, _) in PLANS.items():
            self.flags[plan] = list(DRY_FLAGS) if args.dry_run else [
                forced_plan(self.models[model], f[5:], self.out) if f.startswith("PLAN:") else f for f in flags]

    # --- reference: vanilla llama.cpp of the same build, the whole model on the GPU --------------------------------
    def vanilla(self) -> None:
        for model in ("dense", "moe"):
            for name, prompt in PROMPTS.items():
                t0 = time.time()
                r = self._run([f"{self.args.bin}/llama-completion", "-m", self.models[model], "-p", prompt,
                               "-n", str(N_GEN), "-c", str(CTX), "--temp", "0", "-no-cnv", "-ngl", "99",
                               "--no-display-prompt"], f"vanilla-{model}-{name}")
                ok = r.returncode == 0
                if ok:
                    self.reference[(model, name)] = _generated(r.stdout)
                self.rows.append(Row("llama-completion -ngl 99", model, name, "pass" if ok else "FAIL",
                                     time.time() - t0, "reference" if ok else _tail(r.stderr)))

    def _compare(self, front: str, plan: str, prompt: str, text: str, t0: float, detail: str = "") -> None:
        want = self.reference.get((PLANS[plan][0], prompt))
        if want is None:
            result, detail = "FAIL", "no reference"
        elif text == want or (text and want and (text.startswith(want) or want.startswith(text))):
            result = "pass"  # llama-completion's -n 8 printed 7 tokens where Hypura's front ends print 8
        else:
            result, detail = "DIFFERS", f"{detail} got {text!r}, vanilla {want!r}".strip()
        self.rows.append(Row(front, plan, prompt, result, time.time() - t0, detail))

    def _fail(self, front: str, plan: str, prompt: str, t0: float, detail: str) -> None:
        self.rows.append(Row(front, plan, prompt, "FAIL", time.time() - t0, detail))

    def _run(self, cmd: list[str], log: str, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            r = subprocess.CompletedProcess(cmd, 124, e.stdout or "", f"timed out after {timeout} s")
        (self.out / f"{log}.log").write_text(f"$ {' '.join(cmd)}\n--- rc {r.returncode}\n{r.stdout}\n--- stderr\n"
                                             f"{r.stderr}")
        return r

    # --- the front ends ---------------------------------------------------------------------------------------
    def cli(self, plan: str, prompts=tuple(PROMPTS), extra: tuple[str, ...] = (), front: str = "hypura-cli") -> None:
        model, flags = PLANS[plan][0], self.flags[plan]
        for name in prompts:
            t0 = time.time()
            r = self._run([sys.executable, "-m", "hypura.cli.completion", "-m", self.models[model], "-p",
                           PROMPTS[name], "-n", str(N_GEN), "-c", str(CTX), "--temp", "0", "-no-cnv",
                           "--no-display-prompt", *flags, *extra], f"{front.replace(' ', '')}-{plan}-{name}")
            if r.returncode != 0:
                self._fail(front, plan, name, t0, _tail(r.stderr))
            else:
                self._compare(front, plan, name, _generated(r.stdout), t0, _plan_line(r.stderr))

    def llama(self, plan: str) -> None:
        """hypura.Llama: one load, every prompt; flash attention on, as llama-completion's `-fa auto` has it on a
        GPU (llama-cpp-python's default is off: other kernels, other last bits)."""
        model, flags = PLANS[plan][0], self.flags[plan]
        code = ("import json, sys, hypura\n"
                f"llm = hypura.Llama({self.models[model]!r}, n_ctx={CTX}, flash_attn=True, verbose=False, "
                f"**{budgets_kwargs(flags)!r})\n"
                "out = {}\n"
                f"for name, prompt in {PROMPTS!r}.items():\n"
                f"    out[name] = llm(prompt, max_tokens={N_GEN}, temperature=0, repeat_penalty=1.0)['choices'][0]['text']\n"
                "llm.close()\n"
                "print(json.dumps(out))\n")
        t0 = time.time()
        r = self._run([sys.executable, "-c", code], f"llama-{plan}")
        if r.returncode != 0:
            return self._fail("hypura.Llama", plan, "all", t0, _tail(r.stderr))
        texts = json.loads(r.stdout.strip().splitlines()[-1])
        for name, text in texts.items():
            self._compare("hypura.Llama", plan, name, text, t0)

    def bench(self, plan: str, extra: list[str]) -> None:
        model, flags = PLANS[plan][0], self.flags[plan]
        t0 = time.time()
        label = " ".join(extra)
        with tempfile.NamedTemporaryFile(suffix=".json") as js:
            r = self._run([sys.executable, "-m", "hypura.cli.main", "bench", self.models[model], *flags, *extra,
                           "-r", "1", "--json", js.name], f"bench-{plan}-{'_'.join(extra).replace(',', '.')}")
            figures = re.findall(r'"(?:avg_ts|tok_s|tokens_per_s)": ([0-9.]+)', Path(js.name).read_text() or "")
        if r.returncode != 0:
            return self._fail(f"hypura bench {label}", plan, "-", t0, _tail(r.stderr))
        ok = figures and all(float(x) > 0 for x in figures)
        self.rows.append(Row(f"hypura bench {label}", plan, "-", "pass" if ok else "FAIL", time.time() - t0,
                             _bench_line(r.stdout) if ok else "no figures in its JSON"))

    @contextlib.contextmanager
    def _server(self, plan: str, extra: tuple[str, ...] = (), log_name: str = ""):
        """`hypura serve -np 4` of the plan's model and flags (and `extra`), ready: (its URL, the model's name)."""
        model, flags = PLANS[plan][0], self.flags[plan]
        port = _free_port()
        log = open(self.out / f"{log_name or f'serve-{plan}'}.log", "w")
        server = subprocess.Popen([sys.executable, "-m", "hypura.cli.main", "serve", "-m", self.models[model],
                                   "--port", str(port), "-np", "4", "-c", str(4 * CTX), *flags, *extra],
                                  stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            yield base, _wait_ready(base, server)
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
            log.close()

    def serve(self, plan: str) -> None:
        """hypura serve (-np 4): four clients at once, each prompt, through OpenAI's and Ollama's routes."""
        t0 = time.time()
        try:
            with self._server(plan) as (base, name):
                asks = [("openai", p) for p in PROMPTS] + [("ollama", "100")]
                with concurrent.futures.ThreadPoolExecutor(len(asks)) as pool:
                    futures = [(route, p, pool.submit(_ask, base, name, route, PROMPTS[p])) for route, p in asks]
                    for route, p, f in futures:
                        try:
                            self._compare(f"hypura serve ({route})", plan, p, f.result(timeout=TIMEOUT_S), t0)
                        except Exception as e:
                            self._fail(f"hypura serve ({route})", plan, p, t0, f"{type(e).__name__}: {e}")
        except Exception as e:
            self._fail("hypura serve", plan, "all", t0, f"{type(e).__name__}: {e}")

    def serve_kvu(self, plan: str, prompt: str = "100") -> None:
        """hypura serve -kvu (the sequences share the cells the planner chose): one request, whose greedy text must be
        the same request's through the server without -kvu (same flags, same build); the cells chosen in the detail."""
        front, t0, texts = "hypura serve -kvu", time.time(), {}
        for kvu in (False, True):
            log_name = f"serve-{plan}{'-kvu' if kvu else '-nokvu'}"
            try:
                with self._server(plan, ("-kvu",) if kvu else (), log_name) as (base, name):
                    texts[kvu] = _ask(base, name, "openai", PROMPTS[prompt])
            except Exception as e:
                return self._fail(front, plan, prompt, t0, f"{'with' if kvu else 'without'} -kvu: "
                                                           f"{type(e).__name__}: {e}")
        log = (self.out / f"{log_name}.log").read_text(errors="replace")
        cells = next((ln.split("--kv-unified: ", 1)[1] for ln in log.splitlines() if "--kv-unified: " in ln), "")
        same = texts[True] == texts[False]
        detail = cells if same else f"got {texts[True]!r}, without -kvu {texts[False]!r}; {cells}"
        self.rows.append(Row(front, plan, prompt, "pass" if same else "DIFFERS", time.time() - t0, detail))

    # --- report -----------------------------------------------------------------------------------------------
    def report(self, plans: dict[str, str], note: str = "") -> int:
        lines = ["| front end | plan | prompt tokens | result | s | detail |", "|---|---|---|---|---|---|"]
        for r in self.rows:
            lines.append(f"| {r.front} | {r.plan} | {r.prompt} | {r.result} | {r.seconds:.1f} | "
                         f"{r.detail.replace('|', '/')[:160]} |")
        failed = [r for r in self.rows if r.result != "pass"]
        head = [f"# GPU smoke: {len(self.rows) - len(failed)} of {len(self.rows)} rows pass", "",
                "Plans (budgets over the H200 design profile, what `hypura inspect` chose):", ""]
        head += [f"- **{p}** `{' '.join(PLANS[p][1]) or 'no flags'}`: {PLANS[p][2]}; {plans.get(p, '')}"
                 for p in PLANS] + [""] + ([note, ""] if note else [])
        text = "\n".join(head + lines) + "\n"
        (self.out / "smoke.md").write_text(text)
        (self.out / "smoke.json").write_text(json.dumps([asdict(r) for r in self.rows], indent=1))
        print(text)
        return 1 if failed else 0


def _generated(stdout: str) -> str:
    return stdout.replace(" [end of text]", "").rstrip("\n")


def _tail(text: str, n: int = 2) -> str:
    """The error line where there is one, else the last lines."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"(error|\w+Error|E CUDA|CUDA error|Aborted|Segmentation)", ln)]
    return " / ".join(errors[-n:] or lines[-n:])


def _plan_line(stderr: str) -> str:
    return next((ln[len("hypura: "):] for ln in stderr.splitlines() if ln.startswith("hypura: plan")), "")


def _bench_line(stdout: str) -> str:
    rows = [ln for ln in stdout.splitlines() if ln.startswith("|") and "t/s" not in ln and "---" not in ln]
    return " ; ".join(" ".join(r.split("|")[-2:]).strip() for r in rows[-3:])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(base: str, server: subprocess.Popen, timeout: float = TIMEOUT_S) -> str:
    """The served model's name, once /v1/models answers."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited ({server.returncode}) before it was ready")
        try:
            with urllib.request.urlopen(f"{base}/v1/models", timeout=5) as r:
                return json.loads(r.read())["data"][0]["id"]
        except OSError:
            time.sleep(0.5)
    raise TimeoutError("the server was not ready in time")


def _ask(base: str, model: str, route: str, prompt: str) -> str:
    if route == "openai":
        url, body = f"{base}/v1/completions", {"model": model, "prompt": prompt, "max_tokens": N_GEN, "temperature": 0}
    else:
        url, body = f"{base}/api/generate", {"model": model, "prompt": prompt, "raw": True, "stream": False,
                                             "options": {"num_predict": N_GEN, "temperature": 0}}
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
        reply = json.loads(r.read())
    return reply["choices"][0]["text"] if route == "openai" else reply["response"]


def _inspect(s: Smoke) -> dict[str, str]:
    """Each budget plan's choice, as `hypura inspect` prints it."""
    out = {}
    for plan, (model, flags, _) in PLANS.items():
        if "--plan" in flags:
            continue
        r = subprocess.run([sys.executable, "-m", "hypura.cli.main", "inspect", s.models[model], "-c", str(CTX), *flags],
                           capture_output=True, text=True, errors="replace", timeout=TIMEOUT_S)
        picked = [ln.strip() for ln in r.stdout.splitlines() if re.match(r"(mode|chosen|streams|experts|     0 )", ln)]
        out[plan] = "; ".join(picked)[:300] or _tail(r.stderr, 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dense", required=True)
    ap.add_argument("--moe", required=True)
    ap.add_argument("--draft", help="a draft model for --dense (hypura synth --draft-for)")
    ap.add_argument("--bin", help="the folder of the build's llama-completion")
    ap.add_argument("--out", default="smoke")
    ap.add_argument("--dry-run", action="store_true",
                    help="On a CPU host: the serve -kvu rows alone, on tiny models (hypura synth tiny-llama, "
                         f"tiny-qwen3moe), every plan's flags made `{' '.join(DRY_FLAGS)}`: the rows' own path checked")
    args = ap.parse_args()
    if not args.dry_run and not (args.draft and args.bin):
        ap.error("--draft and --bin are needed (but for --dry-run)")
    os.environ.setdefault("HYPURA_PROFILE", "h200-design")
    s = Smoke(args)
    if args.dry_run:
        for plan in KVU_PLANS:
            s.serve_kvu(plan)
        return s.report({}, f"Dry run on the CPU: every plan's flags `{' '.join(DRY_FLAGS)}`, tiny models.")
    plans = _inspect(s)
    s.vanilla()
    for plan in PLANS:  # hypura.Llama takes every prompt in one load; the CLI the long one (its prompt, then decode)
        s.llama(plan)
        s.cli(plan, ["2100"])
    s.cli("dense-ram-streamed", ["100"], ("-md", args.draft), front="hypura-cli -md")
    s.serve("dense-cpu")
    s.serve("moe-pinned")
    for plan in KVU_PLANS:
        s.serve_kvu(plan)
    for plan in ("dense-ram-streamed", "dense-cpu", "moe-pinned", "moe-disk"):
        s.bench(plan, ["-p", "2048", "-n", "8"])
    for plan in ("dense-ram-streamed", "moe-pinned"):
        s.bench(plan, ["--parallel", "4", "-p", "128", "-n", "8"])
    return s.report(plans)


if __name__ == "__main__":
    sys.exit(main())
