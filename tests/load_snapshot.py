"""Everything a load hands llama.cpp, and what `inspect` prints, over a matrix of models, machines, budgets,
sequences, contexts and devices: the snapshot tests/test_load_snapshot.py holds the code to, so that a change to
how a load is asked for or decided (not to what it decides) is proven to give the GPU exactly what it gave before.

A load runs as far as llama.cpp's model and context parameters, then stops: llama.cpp's model load is a fake that
records its params struct, its context's is a fake that records the context params, the plan and Hypura's fields.
The machine is a fake too (its GPUs, RPC servers and free memory, per case), so nothing is measured.

    python tests/load_snapshot.py --write   # record the snapshot at this tree's code
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import dataclasses
import io
import json
import os
import sys
import tempfile
from pathlib import Path

SNAPSHOT = Path(__file__).parent / "data" / "load_snapshot.json"
GiB = 1 << 30

# (name, synth shape, header only)
MODELS = {
    "tiny-llama": ("tiny-llama", False),
    "tiny-qwen3moe": ("tiny-qwen3moe", False),
    "tiny-mixtral": ("tiny-mixtral", False),
    "llama8b": ("llama3.1-8b", True),
    "qwen30b": ("qwen3-30b-a3b", True),
    "mixtral": ("mixtral-8x7b", True),
}


def _machines():
    """name -> (profile, free memory, llama.cpp's devices): this machine's pinned CPU, one H200, two unequal GPUs."""
    from hypura.profile import resolve_profile
    from hypura.profile.devices import Device
    from hypura.profile.free import FreeMemory
    from hypura.profile.store import load_profile

    cpu = load_profile(Path(__file__).parent / "machine_profile.json")
    h200 = resolve_profile("h200-design")
    g = h200.gpus[0]
    two = dataclasses.replace(h200, gpus=(dataclasses.replace(g, mem_free=20 * GiB, mem_total=24 * GiB),
                                          dataclasses.replace(g, index=2, name="CUDA1", mem_free=14 * GiB,
                                                              mem_total=16 * GiB)))
    host = Device(0, "CPU", "host", "CPU", 100 * GiB, 128 * GiB)

    def gpus(profile):
        return [host] + [Device(x.index, x.name, x.description, "GPU", x.mem_free, x.mem_total) for x in profile.gpus]

    return {
        "cpu": (cpu, FreeMemory(None, 16 * GiB, None, 24 * GiB, "pinned"), gpus(cpu)),
        "h200": (h200, FreeMemory(139 * GiB, 100 * GiB, 140 * GiB, 128 * GiB, "pinned"), gpus(h200)),
        "h200-small": (h200, FreeMemory(6 * GiB, 12 * GiB, 140 * GiB, 24 * GiB, "pinned"), gpus(h200)),
        "two-gpus": (two, FreeMemory(20 * GiB, 40 * GiB, 24 * GiB, 64 * GiB, "pinned"), gpus(two)),
    }


def _cases() -> list[dict]:
    """Each: model, machine, front end (load: Ask.of's keywords; llama: hypura.Llama's; serve: the engine's
    keywords for `parallel` sequences; cli: hypura-cli's argv) and what it is given."""
    out = []

    def case(model, machine, front="load", **given):
        out.append({"model": model, "machine": machine, "front": front, "given": given})

    for machine in ("cpu", "h200", "h200-small", "two-gpus"):
        for model in MODELS:
            case(model, machine)  # the default path: fit, or a plan within the free memory
            case(model, machine, n_gpu_layers=-1, n_ctx=4096)
        case("llama8b", machine, gpu_mem="4GiB", ram="8GiB")
        case("llama8b", machine, gpu_mem="4GiB", ram="8GiB", parallel=4, n_ctx=8192)
        case("qwen30b", machine, gpu_mem="2GiB", ram="6GiB", n_ctx=2048)
        case("qwen30b", machine, ram="10GiB", parallel=4)
        case("mixtral", machine, gpu_mem=0, ram="20GiB", n_ctx=1024)
        case("llama8b", machine, plan="auto", n_gpu_layers=-1)
        case("llama8b", machine, n_gpu_layers=-1, draft_beside="@tiny-llama")
        case("qwen30b", machine, n_gpu_layers=-1, ram="8GiB", draft_beside="@tiny-llama", n_ctx=4096)
        case("tiny-llama", machine, n_gpu_layers=12, n_ctx=512)
        case("tiny-qwen3moe", machine, expert_cache=2, n_gpu_layers=-1)
        case("tiny-llama", machine, fit=False)
        case("tiny-llama", machine, front="llama", n_ctx=256, n_gpu_layers=-1)
        case("llama8b", machine, front="llama", gpu_mem="3GiB", ram="6GiB", n_ctx=2048)
        case("tiny-qwen3moe", machine, front="serve", parallel=4, n_ctx_per_seq=1024)
        case("llama8b", machine, front="serve", parallel=1, n_ctx_per_seq=4096, gpu_mem="5GiB", ram="8GiB")
        case("tiny-llama", machine, front="cli", argv=["-c", "512", "-ngl", "99"])
        case("llama8b", machine, front="cli", argv=["--gpu-mem", "4GiB", "--ram", "8GiB", "-c", "2048"])
        case("qwen30b", machine, front="cli", argv=["-c", "1024"])
        # several devices: Hypura's split over RPC servers (fakes) and this machine's GPUs, or as given
        case("llama8b", machine, n_gpu_layers=-1, rpc_servers="127.0.0.1:50052")
        case("llama8b", machine, n_gpu_layers=-1, rpc_servers="127.0.0.1:50052,127.0.0.1:50053",
             rpc_mem=["2GiB", "1GiB"], gpu_mem="3GiB", ram="8GiB", n_ctx=2048)
        case("llama8b", machine, n_gpu_layers=-1, split=True, n_ctx=8192)
        case("llama8b", machine, n_gpu_layers=-1, split=True, gpu_mem="3GiB,2GiB", ram="20GiB")
        case("qwen30b", machine, n_gpu_layers=-1, split=True)
        case("llama8b", machine, n_gpu_layers=-1, rpc_servers="127.0.0.1:50052", tensor_split=[3.0, 1.0])
        case("llama8b", machine, n_gpu_layers=-1, rpc_servers="127.0.0.1:50052", devices=["RPC0"])
        case("llama8b", machine, n_gpu_layers=20, split=True)
        case("llama8b", machine, front="cli", argv=["--rpc", "127.0.0.1:50052", "--rpc-mem", "2GiB", "-c", "2048"])
        case("llama8b", machine, front="cli", argv=["--split", "--ram", "12GiB"])
        case("llama8b", machine, front="llama", n_gpu_layers=-1, rpc_servers=["127.0.0.1:50052"], n_ctx=1024)
    return out


def _inspect_cases() -> list[tuple[str, list[str]]]:
    """(model, `hypura inspect` flags); --json's file is printed too."""
    out = []
    for profile in ("h200-design", "m1-max-32gb", "@cpu", "@two-gpus"):
        p = ["--profile", profile]
        out += [("llama8b", p), ("llama8b", p + ["--gpu-mem", "4GiB", "--ram", "8GiB", "-c", "2048"]),
                ("qwen30b", p + ["--ram", "10GiB", "-np", "4"]), ("mixtral", p + ["--gpu-mem", "0", "--ram", "20GiB"]),
                ("llama8b", p + ["-md", "@tiny-llama", "--json", "@json"]),
                ("qwen30b", p + ["--gpu-mem", "2GiB", "--ram", "6GiB", "-c", "2048", "--json", "@json"]),
                ("llama8b", p + ["--split"]), ("llama8b", p + ["--split", "--gpu-mem", "3GiB,2GiB", "--ram", "6GiB"]),
                ("llama8b", p + ["--rpc", "127.0.0.1:50052"]),
                ("llama8b", p + ["--rpc", "127.0.0.1:50052,127.0.0.1:50053", "--rpc-mem", "2GiB,1GiB", "-c", "1024"]),
                ("qwen30b", p + ["--split", "--no-disk", "--ram", "4GiB"])]
    return out


class _Stop(Exception):
    """The load has handed llama.cpp everything: stop before it reads a weight."""


def _struct(p) -> dict:
    """A params struct's fields: numbers as they are, a tensor_split its values, other pointers set or not."""
    import llama_cpp

    out = {}
    for name, kind in p._fields_:
        v = getattr(p, name)
        if name == "tensor_split":
            out[name] = [float(x) for x in v[:llama_cpp.LLAMA_MAX_DEVICES]] if v else None
        elif kind is ctypes.c_void_p or name.endswith("_data"):  # an address: set or not
            out[name] = bool(v)
        elif isinstance(v, (int, float, bool)):
            out[name] = v
        elif isinstance(v, bytes):
            out[name] = v.decode()
        else:
            out[name] = bool(v) if not isinstance(v, ctypes.Structure) else _struct(v)
    return out


@contextlib.contextmanager
def _fake_machine(machine: str, record: dict):
    """Every probe of the machine and the servers a fake, llama.cpp's loads recorders."""
    import importlib

    load_module = importlib.import_module("hypura.loaded.load")
    from hypura.plan import load_params
    from hypura.profile import devices, free, measure, rpc
    from hypura.profile.rpc import RpcDevice
    from hypura.runtime import device_list, plan_policy
    from hypura.runtime import runtime as runtime_module

    profile, mem, listed = _machines()[machine]
    saved = []

    def patch(obj, name, value):
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    servers = {}

    def add_servers(spec, say=None):
        names = []
        for ep in rpc.parse_servers(spec):
            servers.setdefault(str(ep), f"RPC{len(servers)}")
            names.append(servers[str(ep)])
        return tuple(names)

    def measure_device(name, nbytes=0):
        i = int(name[3:])
        return RpcDevice(name, f"127.0.0.1:{50052 + i}", (6 - 2 * i) * GiB, 8 * GiB, 1.1e9, 0.2e-3, 40e9, "fake")

    def listed_now(remote=True):
        out = list(listed)
        if remote:
            out += [devices.Device(10 + i, n, ep, "GPU", 6 * GiB, 8 * GiB, remote=True) for i, (ep, n) in enumerate(servers.items())]
        return out

    def device_array(names):
        record["devices"] = None if names is None else list(names)
        return None

    class Model:
        def __init__(self, n_ctx_train):
            self._n = n_ctx_train

        def n_ctx_train(self):
            return self._n

    def load_model(stack, path, params, verbose=False):
        record["model_params"] = _struct(params)
        from hypura.modelfile import read_header

        return Model(int(read_header(path).get("context_length", 0) or 0))

    def new_context(stack, model, params, verbose=False, cls=None, runtime=None, **kw):
        record["context_params"] = _struct(params)
        record["fields"] = {struct: {k: v if isinstance(v, (int, float, str)) and not k.endswith("_data") else bool(v)
                                     for k, v in fields.items()} for struct, fields in runtime.params.merged().items()}
        record["plan"] = runtime.plan.to_dict() if runtime.plan is not None else None
        raise _Stop

    patch(devices, "list_devices", listed_now)
    for module in (devices, runtime_module, plan_policy):
        patch(module, "has_gpu", lambda: bool(profile.gpus))
    patch(free, "free_memory", lambda: mem)
    patch(measure, "planning_profile", lambda *a, **k: profile)
    patch(rpc, "add_servers", add_servers)
    patch(rpc, "measure_device", measure_device)
    patch(rpc, "probe_registered", lambda *a, **k: None)
    patch(device_list, "device_array", device_array)
    patch(load_module, "device_array", device_array)
    patch(load_module, "load_model", load_model)
    patch(load_module, "new_context", new_context)
    patch(load_params.Host, "here", classmethod(lambda cls: cls(bool(profile.gpus), 8, 16)))
    patch(load_params.Host, "profiled", classmethod(lambda cls, p: cls(p.gpu is not None, 8, 16)))
    try:
        yield profile
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)


def _models(folder: Path) -> dict[str, Path]:
    from hypura.synth import write_synth

    out = {}
    for name, (shape, sparse) in MODELS.items():
        out[name] = folder / f"{name}.gguf"
        if not out[name].exists():
            write_synth(shape, out[name], ftype="q4_k_m" if sparse else None, sparse=sparse)
    return out


def _given(given: dict, models: dict) -> dict:
    return {k: (str(models[v[1:]]) if isinstance(v, str) and v.startswith("@") else v) for k, v in given.items()}


def _clean(value, folder: Path):
    """The models' folder out of every string (it is a temporary one); a plan's tensors as their digest."""
    text = json.dumps(value, sort_keys=True, default=str)
    out = json.loads(text.replace(str(folder) + "/", ""))
    for plan in (out.get("plan"), out.get("json")):
        if plan:
            plan["tensors"] = hashlib.sha256(json.dumps(plan["tensors"], sort_keys=True).encode()).hexdigest()
    return out


def _load_case(case: dict, models: dict) -> dict:
    from hypura.errors import HypuraError

    record: dict = {}
    given = _given(case["given"], models)
    path = str(models[case["model"]])
    err = io.StringIO()
    with _fake_machine(case["machine"], record), contextlib.redirect_stderr(err):
        try:
            _run_front(case["front"], path, given)
        except _Stop:
            pass
        except HypuraError as e:
            record["error"] = str(e)
        except Exception as e:  # noqa: BLE001  (recorded: the refactor must fail the same way)
            record["exception"] = f"{type(e).__name__}: {e}"
    record["said"] = [line for line in err.getvalue().splitlines() if line.startswith("hypura:")]
    return record


def _run_front(front: str, path: str, given: dict) -> None:
    if front == "load":
        from hypura.loaded import Ask, load

        load(path, Ask.of(verbose=False, **given))
    elif front == "llama":
        from hypura import Llama

        Llama(path, verbose=False, **given)
    elif front == "serve":
        from hypura.engine.loader import engine_llama_kwargs
        from hypura.loaded import Ask, load

        load(path, Ask.of(**engine_llama_kwargs(**given)))
    elif front == "cli":
        from hypura.cli.completion.arg import parse
        from hypura.cli.completion.common_init import load_model

        lines = []
        load_model(parse(["-m", path] + given["argv"]), path, say=lines.append)
        for line in lines:
            print(line, file=sys.stderr)
    else:
        raise ValueError(front)


def _inspect_case(model: str, flags: list[str], models: dict, folder: Path) -> dict:
    from click.testing import CliRunner

    from hypura.cli.inspect_cmd import inspect

    record: dict = {}
    machine = next((f[1:] for f in flags if f.startswith("@") and f[1:] in _machines()), "cpu")
    profile_file = folder / f"{machine}.profile.json"
    json_file = folder / "plan.json"
    argv = []
    for f in flags:
        if f == "@json":
            argv.append(str(json_file))
        elif f.startswith("@") and f[1:] in _machines():
            argv.append(str(profile_file))
        else:
            argv.append(str(models[f[1:]]) if f.startswith("@") else f)
    with _fake_machine(machine, record) as profile:
        if not profile_file.exists():
            profile.save(profile_file)
        json_file.unlink(missing_ok=True)
        result = CliRunner().invoke(inspect, [str(models[model])] + argv)
    record["exit"] = result.exit_code
    record["output"] = [line for line in result.output.splitlines() if not line.startswith("planned in ")]
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        record["exception"] = repr(result.exception)
    if json_file.exists():
        record["json"] = json.loads(json_file.read_text())
    return record


def snapshot(folder: Path) -> dict:
    """Every case's record, keyed by a readable name."""
    models = _models(folder)
    out = {}
    for case in _cases():
        key = f"{case['front']} {case['model']} on {case['machine']}: {json.dumps(case['given'], sort_keys=True)}"
        out[key] = _clean(_load_case(case, models), folder)
    for model, flags in _inspect_cases():
        out[f"inspect {model} {' '.join(flags)}"] = _clean(_inspect_case(model, flags, models, folder), folder)
    return out


if __name__ == "__main__":
    os.environ.setdefault("HYPURA_FREE_MEMORY", "gpu=0,ram=16GiB")
    os.environ.setdefault("HYPURA_PROFILE", str(Path(__file__).parent / "machine_profile.json"))
    with tempfile.TemporaryDirectory(prefix="hypura-snapshot-") as tmp:
        os.environ["HYPURA_ROUTING_DIR"] = str(Path(tmp) / "routing")
        os.environ.setdefault("XDG_CACHE_HOME", str(Path(tmp) / "cache"))
        data = snapshot(Path(tmp))
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    if "--write" in sys.argv:
        SNAPSHOT.parent.mkdir(exist_ok=True)
        SNAPSHOT.write_text(text)
        print(f"{len(data)} cases written to {SNAPSHOT}")
    else:
        sys.stdout.write(text)
