"""Measurements that run in a child process: what they allocate (the RAM copy's 512 MiB, a GPU link test's
1 GiB pinned and 1 GiB pageable buffers, a model's blocks) never counts in the caller's RSS peak, which a
first plan's run budgets in the same process; their threads and GPU context go with the child.

`call(fn, *args)` runs the module-level function `fn` in `python -m hypura.profile.apart` with JSON
arguments and returns its result as JSON gives it back (a dataclass as a dict; the child's last line of
stdout); a failure is a HypuraError with
the child's last line of stderr.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from hypura.errors import HypuraError

TIMEOUT_S = 300  # a child loads at most measure_knobs.SLICE_BYTES and measures for seconds


@contextlib.contextmanager
def quiet_stderr():
    """llama.cpp logs from C to fd 2; keep the profile's progress readable."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def call(fn: Callable, *args) -> Any:
    target = f"{fn.__module__}:{fn.__qualname__}"
    try:
        r = subprocess.run([sys.executable, "-m", __name__, target, json.dumps(args)], capture_output=True,
                           text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise HypuraError(f"{fn.__name__} took over {TIMEOUT_S} s") from None
    out = r.stdout.strip().splitlines()
    if r.returncode != 0 or not out:
        why = (r.stderr.strip() or f"exit status {r.returncode}").splitlines()[-1]
        raise HypuraError(f"{fn.__name__} failed: {why}")
    return json.loads(out[-1])


if __name__ == "__main__":
    module, name = sys.argv[1].split(":")
    result = getattr(importlib.import_module(module), name)(*json.loads(sys.argv[2]))
    print(json.dumps(dataclasses.asdict(result) if dataclasses.is_dataclass(result) else result))
