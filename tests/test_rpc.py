"""llama.cpp RPC servers as devices: the probe that keeps a dead server from aborting the process, the flags as
llama-completion reads them, and two loopback ggml-rpc-server processes running SmolLM2 with the same greedy
text as the local run."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hypura.errors import HypuraError
from hypura.profile import rpc

HYPURA_CLI = [sys.executable, "-m", "hypura.cli.completion"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _fake_server(answer: bytes | None):
    """A TCP server on loopback that reads a hello and answers `answer` (None: never answers)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    stop = threading.Event()

    def serve():
        conn, _ = srv.accept()
        with conn:
            conn.recv(1 + 8 + 24)
            if answer is not None:
                conn.sendall(answer)
            stop.wait(10)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield rpc.Endpoint("127.0.0.1", srv.getsockname()[1])
    finally:
        stop.set()
        srv.close()


def test_endpoints_parse_as_llama_cpp_takes_them():
    assert rpc.parse_servers("127.0.0.1:50052,localhost:1") == (rpc.Endpoint("127.0.0.1", 50052),
                                                                 rpc.Endpoint("localhost", 1))
    assert rpc.parse_servers(["[::1]:7"]) == (rpc.Endpoint("::1", 7),)
    assert [e.loopback for e in rpc.parse_servers("127.0.0.1:1,localhost:1,::1:1,10.0.0.7:1,gpu-box:1")] == \
        [True, True, True, False, False]
    for bad in ("", "hostonly", "h:0", "h:port", ":50052"):
        with pytest.raises(HypuraError):
            rpc.parse_servers(bad)


def test_a_dead_server_is_one_line_before_anything_connects():
    ep = rpc.Endpoint("127.0.0.1", _free_port())
    with pytest.raises(HypuraError, match=r"^RPC server 127\.0\.0\.1:\d+: connection refused \(is ggml-rpc-server "
                                          r"running there\?\)$"):
        rpc.probe(ep, timeout=1.0)


def test_a_silent_server_times_out_instead_of_hanging():
    with _fake_server(None) as ep:
        with pytest.raises(HypuraError, match="no answer within 0.3 s .* serves one at a time"):
            rpc.probe(ep, timeout=0.3)


def test_another_protocol_version_is_refused():
    with _fake_server(struct.pack("<Q", 28) + bytes([6, 0, 1, 0]) + bytes(24)) as ep:
        with pytest.raises(HypuraError, match=r"speaks RPC protocol v6\.0\.1, this llama\.cpp v7\.0"):
            rpc.probe(ep, timeout=2.0)
    with _fake_server(struct.pack("<Q", 4) + bytes(4)) as ep:
        with pytest.raises(HypuraError, match="not a ggml-rpc-server of protocol v7"):
            rpc.probe(ep, timeout=2.0)
    with _fake_server(struct.pack("<Q", 28) + bytes([7, 0, 0, 0]) + bytes(24)) as ep:
        assert rpc.probe(ep, timeout=2.0) == (7, 0, 0)


def test_a_remote_server_is_said_unauthenticated_in_one_line(monkeypatch):
    """Said before it is probed (the probe then fails here: nothing listens on TEST-NET-1)."""
    said = []
    monkeypatch.setattr(rpc, "probe", lambda ep: (_ for _ in ()).throw(HypuraError(f"RPC server {ep}: down")))
    with pytest.raises(HypuraError, match="down"):
        rpc.add_servers("127.0.0.1:1,192.0.2.1:50052", say=said.append)
    assert said == ["hypura: RPC server 192.0.2.1:50052 is not on loopback: rpc-server has no authentication, "
                    "its traffic is plain TCP"]


@contextlib.contextmanager
def _hello_server():
    """A loopback server that answers every connection's hello as a v7.0 ggml-rpc-server does, until closed."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return  # closed
            with conn:
                conn.recv(1 + 8 + 24)
                conn.sendall(struct.pack("<Q", 28) + bytes([7, 0, 0, 0]) + bytes(24))

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield rpc.Endpoint("127.0.0.1", srv.getsockname()[1])
    finally:
        srv.shutdown(socket.SHUT_RDWR)  # wakes the accept: a close alone leaves the port listening under it
        srv.close()


def test_a_server_that_died_since_it_was_added_is_one_line_at_the_next_load(monkeypatch):
    """Registered once per process, probed on every load: llama.cpp's client would abort on the dead server."""
    monkeypatch.setattr(rpc, "_registered", {})
    monkeypatch.setattr(rpc, "_register", lambda endpoint: ("RPC7",))  # llama.cpp never connects to the fake
    with _hello_server() as ep:
        assert rpc.add_servers(str(ep)) == ("RPC7",)
        rpc.probe_registered(None)  # alive: nothing said
    dead = rf"^RPC server 127\.0\.0\.1:{ep.port}: connection refused \(is ggml-rpc-server running there\?\)$"
    with pytest.raises(HypuraError, match=dead):
        rpc.add_servers(str(ep))
    # a load that names no server still gets llama.cpp's default devices, the registered ones among them
    with pytest.raises(HypuraError, match=dead):
        rpc.probe_registered(None)
    with pytest.raises(HypuraError, match=dead):
        rpc.probe_registered(["RPC7"])
    rpc.probe_registered(["CUDA0"])  # a device list without the dead server's devices: nothing to probe
    rpc.probe_registered(None, but=[ep])  # given again by this load: add_servers probes it


def test_a_product_faster_than_a_round_trips_jitter_is_not_free_compute():
    """A GPU server's product of 64 MiB (20 us) under a 300 us round trip whose jitter is larger than the product:
    the round trip less the latency alone gave up to 6.7e16 B/s."""
    nbytes, product, round_trip = 64 << 20, 20e-6, 300e-6
    jitter = [0.0, 150e-6, 40e-6, 90e-6, 10e-6]
    asked = []

    def products(k):
        asked.append(k)
        return round_trip + jitter[len(asked) % len(jitter)] + k * product

    assert rpc.decode_rate(nbytes, products, round_trip) == pytest.approx(nbytes / product, rel=0.05)
    assert max(asked) <= rpc.MAX_PRODUCTS
    # a CPU server's product (5 ms): resolved at the first k
    asked.clear()
    rate = rpc.decode_rate(nbytes, lambda k: asked.append(k) or round_trip + k * 5e-3, round_trip)
    assert rate == pytest.approx(nbytes / 5e-3) and asked == [1, 4]
    # products that take no time at all, or measure faster than one alone: bounded, never free
    for seconds in (lambda k: round_trip, lambda k: round_trip + 1e-3 / k):
        assert rpc.decode_rate(nbytes, seconds, round_trip) == rpc.MAX_DECODE_BW


def test_an_rpc_device_is_never_the_gpu_whose_memory_stats_report(monkeypatch):
    """RPC servers' devices register as GPUs: stats' GPU is this machine's, not the first device of kind GPU."""
    from hypura.profile import devices
    from hypura.profile.devices import Device
    from hypura.runtime.stats import gpu_free

    GiB = 1 << 30
    rpc0 = Device(1, "RPC0", "127.0.0.1:50052", "GPU", 60 * GiB, 64 * GiB, remote=True)
    cuda0 = Device(2, "CUDA0", "NVIDIA H100", "GPU", 70 * GiB, 80 * GiB)
    cpu = Device(0, "CPU", "host", "CPU", 100 * GiB, 128 * GiB)
    records = [cpu, rpc0, cuda0]
    asked = []

    def listed(remote=True):
        asked.append(remote)
        return [d for d in records if remote or not d.remote]

    monkeypatch.setattr(devices, "list_devices", listed)
    assert gpu_free() == 70 * GiB and asked == [False]  # a dead server's memory is never asked
    records.remove(cuda0)
    assert gpu_free() is None  # a CPU host with an RPC server has no GPU
    # a list that holds the remote devices anyway: still not among this machine's GPUs
    monkeypatch.setattr(devices, "list_devices", lambda remote=True: [cpu, rpc0, cuda0])
    assert devices.local_gpus() == [cuda0]


def test_device_flags_parse_as_llama_completion_reads_them():
    from hypura.cli.completion.arg import parse
    from hypura.cli.completion.arg_values import ArgvError
    from hypura.cli.completion.device_flags import DeviceSettings

    assert parse([]).devices == DeviceSettings() and not parse([]).placement_set
    s = parse(["--rpc", "127.0.0.1:50052", "-dev", "RPC0,CUDA0", "-sm", "row", "-ts", "3,1/2", "-mg", "1",
               "--rpc-mem", "1GiB,512MiB"])
    assert s.devices == DeviceSettings("127.0.0.1:50052", ("RPC0", "CUDA0"), 2, (3.0, 1.0, 2.0), 1,
                                       (1 << 30, 512 << 20))
    assert s.placement_set  # a device list or split: placement as given, no --fit
    assert not parse(["--rpc", "127.0.0.1:50052"]).placement_set  # servers alone: Hypura splits over them
    for argv, message in ((["-sm", "diagonal"], 'error while handling argument "--split-mode": invalid value'),
                          (["-ts", ",".join(["1"] * 16)], "got 16 input configs, but system only has 16 devices"),
                          (["--rpc", ","], "no RPC servers specified"),
                          (["-mg", "x"], 'error while handling argument "--main-gpu"'),
                          (["--rpc-mem", "lots"], "bad size 'lots'")):
        with pytest.raises(ArgvError, match=message):
            parse(argv)


def test_cli_with_a_dead_server_fails_in_one_line(smollm2_path):
    port = _free_port()
    p = subprocess.run(HYPURA_CLI + ["-m", str(smollm2_path), "--rpc", f"127.0.0.1:{port}", "-p", "hi", "-n", "2",
                                     "-no-cnv"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and p.stdout == ""
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert lines[-1].endswith(f"RPC server 127.0.0.1:{port}: connection refused (is ggml-rpc-server running there?)")
    assert "Traceback" not in p.stderr


def _device_message(name: str) -> str:
    from hypura.runtime.device_list import offload_devices

    there = offload_devices()  # this machine's, named in the message whatever they are
    return (f"invalid device: {name} (" + (f"available: {', '.join(there)}" if there else "no device to offload to here")
            + '; "none" offloads nothing)')


def test_cli_with_an_unknown_device_fails_in_one_line(smollm2_path):
    p = subprocess.run(HYPURA_CLI + ["-m", str(smollm2_path), "-dev", "BOGUS", "-p", "hi", "-n", "2", "-no-cnv"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and p.stdout == ""
    errors = [line for line in p.stderr.splitlines() if line.startswith("error")]
    assert errors == [f"error: {_device_message('BOGUS')}"], p.stderr[-2000:]


def test_llama_with_an_unknown_device_says_which_exist(smollm2_path):
    import hypura
    from hypura.errors import DeviceError

    with pytest.raises(DeviceError) as e:
        hypura.Llama(str(smollm2_path), devices=["x"], verbose=False)
    assert isinstance(e.value, HypuraError) and str(e.value) == _device_message("x")


# --- two loopback servers ----------------------------------------------------------------------------------


@pytest.fixture
def rpc_servers(llama_tools_dir):
    """Two ggml-rpc-server processes on 127.0.0.1, CPU backends, one thread each; killed at the end."""
    exe = Path(llama_tools_dir) / "ggml-rpc-server"
    if not exe.is_file():  # the build makes it beside libllama: its absence is a broken build, not a machine's limit
        pytest.fail(f"no {exe}: run ./build.sh, which builds ggml-rpc-server beside libllama")
    procs, endpoints = [], []
    try:
        for _ in range(2):
            port = _free_port()
            procs.append(subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port), "-d", "CPU", "-t", "1"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            endpoints.append(f"127.0.0.1:{port}")
        for ep in endpoints:
            rpc.wait_listening(ep)
        yield procs, endpoints
    finally:
        for p in procs:
            p.kill()
            p.wait()


# Run apart: RPC devices stay registered in a process for its lifetime (ggml has no way to remove them), and a
# later load in the same process would offer llama.cpp the killed servers' devices.
_SPLIT_RUN = r"""
import json, sys
import numpy as np
from hypura import Llama

model, servers, prompt, n = sys.argv[1], sys.argv[2], sys.argv[3].encode(), int(sys.argv[4])

def greedy(llm):
    tokens = llm.tokenize(prompt)
    llm.reset()
    out, gaps = [], []
    for _ in range(n):
        llm.eval(tokens if not out else [out[-1]])
        logits = np.array(llm.scores[llm.n_tokens - 1], copy=True)
        top2 = np.partition(logits, -2)[-2:]
        out.append(int(np.argmax(logits)))
        gaps.append(float(top2[1] - top2[0]))
    return out, gaps

local = Llama(model, n_ctx=256, n_threads=1, verbose=False, logits_all=True)
want, gaps = greedy(local)
local.close()
# RPC devices of 290 MiB each and 460 MiB here: none holds SmolLM2 (92 MiB) beside its 256 MiB compute buffer alone
llm = Llama(model, n_ctx=256, n_threads=1, n_gpu_layers=-1, verbose=False, logits_all=True, ram="460MiB",
            rpc_servers=servers, rpc_mem=["290MiB", "290MiB"])
s = llm.decision.shares
got, _ = greedy(llm)
print(json.dumps({"want": want, "gaps": gaps, "got": got, "host": s.host_layers, "layers": s.layers,
                  "devices": llm.decision.devices}))
llm.close()
"""

# a logit gap above this is far beyond the numeric noise between backends' kernels (~1e-3 on these logits): where the
# two top tokens are closer, the runs may part legitimately and the comparison stops there
CLEAR_GAP = 0.1


@pytest.mark.slow
def test_two_loopback_servers_split_smollm2_with_the_local_greedy_text(rpc_servers, smollm2_path):
    _, endpoints = rpc_servers
    n = 16
    p = subprocess.run([sys.executable, "-c", _SPLIT_RUN, str(smollm2_path), ",".join(endpoints),
                        "The three primary colors are", str(n)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["host"] > 0 and all(r["layers"]) and r["devices"] == ["RPC0", "RPC1"]  # all three hold a share
    clear = next((i for i, g in enumerate(r["gaps"]) if g < CLEAR_GAP), n)
    assert clear >= 4 and r["got"][:clear] == r["want"][:clear], r


@pytest.mark.slow
def test_a_killed_server_is_one_clear_line(rpc_servers, smollm2_path):
    procs, endpoints = rpc_servers
    procs[1].kill()
    procs[1].wait()
    p = subprocess.run(HYPURA_CLI + ["-m", str(smollm2_path), "--rpc", ",".join(endpoints), "-p", "hi", "-n", "2",
                                     "-no-cnv", "-t", "1"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    assert p.stderr.strip().splitlines()[-1].endswith(f"RPC server {endpoints[1]}: connection refused "
                                                      "(is ggml-rpc-server running there?)")


# a process that loaded with a server keeps its devices (llama.cpp's default device list holds them): after the
# server dies, a load naming it again and a load naming none are both one HypuraError, not llama.cpp's abort
_RELOAD_RUN = r"""
import sys
from hypura import Llama
from hypura.errors import HypuraError

model, server = sys.argv[1], sys.argv[2]
Llama(model, n_ctx=256, n_threads=1, verbose=False, rpc_servers=server).close()
print("loaded", flush=True)
sys.stdin.readline()  # the server is killed meanwhile
for keywords in ({"rpc_servers": server}, {}):
    try:
        Llama(model, n_ctx=256, n_threads=1, verbose=False, **keywords).close()
        print("loaded again", flush=True)
    except HypuraError as e:
        print(f"refused: {e}", flush=True)
"""


@pytest.mark.slow
def test_a_server_that_dies_after_a_load_refuses_the_next_loads_in_one_line(rpc_servers, smollm2_path):
    procs, endpoints = rpc_servers
    p = subprocess.Popen([sys.executable, "-c", _RELOAD_RUN, str(smollm2_path), endpoints[0]], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "loaded", p.stderr.read()[-3000:]
        procs[0].kill()
        procs[0].wait()
        out, err = p.communicate("\n", timeout=120)
    finally:
        p.kill()
    refused = f"refused: RPC server {endpoints[0]}: connection refused (is ggml-rpc-server running there?)"
    assert p.returncode == 0 and out.splitlines() == [refused, refused], err[-3000:]


@pytest.mark.slow
def test_given_devices_and_split_run_as_in_llama_completion(rpc_servers, smollm2_path, llama_tools_dir):
    """--rpc with -dev/-ngl/-ts is placement as given: hypura-cli prints what llama-completion prints with the same
    servers (one after the other: a server serves one client at a time)."""
    _, endpoints = rpc_servers
    args = ["-m", str(smollm2_path), "--rpc", ",".join(endpoints), "-dev", "RPC0,RPC1", "-ngl", "99", "-ts", "2,1",
            "-p", "The three primary colors are", "-n", "12", "--temp", "0", "-no-cnv", "-t", "1"]
    ref = subprocess.run([str(Path(llama_tools_dir) / "llama-completion"), *args], capture_output=True, timeout=300,
                         stdin=subprocess.DEVNULL)
    hyp = subprocess.run(HYPURA_CLI + args, capture_output=True, timeout=300, stdin=subprocess.DEVNULL)
    assert ref.returncode == 0, ref.stderr[-2000:]
    assert hyp.returncode == 0, hyp.stderr[-2000:]
    assert hyp.stdout == ref.stdout and len(hyp.stdout) > 20


@pytest.mark.slow
def test_serve_and_bench_with_a_dead_server_fail_in_one_line(smollm2_path):
    """`hypura serve -m ... --rpc` loads its model at start and `hypura bench --rpc` before it measures: a dead server
    is one error line and status 1 for both."""
    port = _free_port()
    for args in (["serve", "-m", str(smollm2_path), "--port", "0", "--rpc", f"127.0.0.1:{port}"],
                 ["bench", str(smollm2_path), "--rpc", f"127.0.0.1:{port}", "-p", "8", "-n", "4", "-r", "1"]):
        p = subprocess.run([sys.executable, "-m", "hypura.cli.main", *args], capture_output=True, text=True,
                           timeout=120, stdin=subprocess.DEVNULL)
        errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
        assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
        assert len(errors) == 1 and errors[0].endswith(f"RPC server 127.0.0.1:{port}: connection refused "
                                                       "(is ggml-rpc-server running there?)"), p.stderr[-2000:]


def test_cli_says_a_remote_server_is_unauthenticated(smollm2_path):
    """TEST-NET-1 (192.0.2.0/24) is never a real host: refused or silent, one error after the one warning line."""
    import os

    p = subprocess.run(HYPURA_CLI + ["-m", str(smollm2_path), "--rpc", "192.0.2.1:50052", "-p", "hi", "-n", "2",
                                     "-no-cnv"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HYPURA_RPC_TIMEOUT": "1"})
    assert p.returncode == 1
    warned = [line for line in p.stderr.splitlines() if "not on loopback" in line]
    assert len(warned) == 1 and warned[0].endswith("hypura: RPC server 192.0.2.1:50052 is not on loopback: rpc-server "
                                                   "has no authentication, its traffic is plain TCP")
    assert p.stderr.strip().splitlines()[-1].startswith("error: RPC server 192.0.2.1:50052: ")


def test_split_without_servers_plans_over_this_machines_devices(smollm2_path):
    """--split on a machine with no GPU and no server: every layer stays on the host, nothing is offloaded, the text
    is the default path's."""
    base = ["-m", str(smollm2_path), "-p", "The three primary colors are", "-n", "8", "--temp", "0", "-no-cnv",
            "-t", "1"]
    plain = subprocess.run(HYPURA_CLI + base, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    split = subprocess.run(HYPURA_CLI + base + ["--split", "--ram", "2GiB"], capture_output=True, text=True,
                           timeout=120, stdin=subprocess.DEVNULL)
    assert plain.returncode == 0 and split.returncode == 0, split.stderr[-2000:]
    assert "hypura: devices: host 31 of 31 layers" in split.stderr
    assert split.stdout == plain.stdout
