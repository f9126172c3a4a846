"""llama.cpp RPC servers (`ggml-rpc-server`, `--rpc host:port,...`) as devices of this process.

llama.cpp's RPC client aborts the process when a server is down or speaks another protocol (ggml-rpc.cpp:
GGML_ABORT in rpc_dispatcher::start). So before llama.cpp connects, each server is opened here with a short
timeout and greeted with RPC_CMD_HELLO, the protocol's first message, whose wire format is fixed across versions:

    request:  | cmd (1 byte) = 14 | size (8 bytes, little-endian) = 24 | conn_caps (24 bytes) |
    response: | size (8 bytes) = 28 | major, minor, patch, padding (4 bytes) | conn_caps (24 bytes) |

A server that answers is then registered through llama.cpp's own API (the RPC reg's ggml_backend_rpc_add_server,
as common/arg.cpp does), and its devices are ggml devices like a local GPU. rpc-server has no authentication:
a server that is not on loopback is said so, in one line.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import gguf
import numpy as np

from hypura.errors import HypuraError

# ggml-rpc.h / ggml-rpc.cpp of the pinned llama.cpp: the protocol this client speaks
RPC_PROTO_MAJOR = 7
RPC_PROTO_MINOR = 0
_CMD_HELLO = 14  # static_assert(RPC_CMD_HELLO == 14) upstream: every version greets the same way
_CONN_CAPS = 24  # transport.h RPC_CONN_CAPS_SIZE
_HELLO_RSP = 4 + _CONN_CAPS
# a server that answers at all answers a hello in microseconds; a few seconds covers a slow WAN and a busy
# server (it serves one client at a time: a second client's hello waits for the first to leave)
DEFAULT_TIMEOUT_S = 3.0
TIMEOUT_ENV = "HYPURA_RPC_TIMEOUT"

# link measurement: a transfer large enough that a 1 Gb/s network's rate shows (67 ms), under the 10 MiB above which
# the client first offers the server a hash of the data (ggml-rpc.cpp HASH_THRESHOLD); the round trip from a 4-byte
# read, best of several
LINK_BYTES = 8 << 20
# the decode measurement's weight: beyond a server CPU's last-level cache, so its memory rate shows
MATVEC_BYTES = 64 << 20
LINK_REPEATS = 3
LATENCY_REPEATS = 20
# the decode measurement runs k products back to back before one read, k growing until the k products take this
# much longer than one (and longer than a few round trips): a GPU's product of 64 MiB (~20 us) is far below a
# network round trip's jitter, which its difference from the round trip alone measured; MAX_PRODUCTS k at most
RESOLVE_S = 2e-3
MAX_PRODUCTS = 1024
# no memory reads weights faster (an H200's HBM3e: 4.8 TB/s): a rate beyond this is a measurement's error
MAX_DECODE_BW = 10e12


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False  # a host name: where it resolves is not ours to assume


def parse_servers(spec: str | Iterable[str]) -> tuple[Endpoint, ...]:
    """`host:port,host:port` (llama.cpp's --rpc value; a list of them in Python) as endpoints."""
    items = [p for s in ([spec] if isinstance(spec, str) else list(spec)) for p in str(s).split(",")]
    if not items or not any(items):
        raise HypuraError("no RPC servers specified")
    out = []
    for item in items:
        host, sep, port = item.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise HypuraError(f"RPC server '{item}': not host:port")
        out.append(Endpoint(host.strip("[]"), int(port)))
    return tuple(out)


def timeout_s() -> float:
    try:
        return float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
    except ValueError:
        raise HypuraError(f"${TIMEOUT_ENV} must be seconds, got {os.environ[TIMEOUT_ENV]!r}") from None


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed the connection")
        data += chunk
    return data


def probe(ep: Endpoint, timeout: float | None = None) -> tuple[int, int, int]:
    """The server's protocol version (major, minor, patch), or a HypuraError of one line: down, unreachable,
    silent (busy with another client, or not an RPC server) or of a protocol this client does not speak."""
    timeout = timeout_s() if timeout is None else timeout
    where = f"RPC server {ep}"
    try:
        with socket.create_connection((ep.host, ep.port), timeout=timeout) as sock:
            sock.sendall(struct.pack("<BQ", _CMD_HELLO, _CONN_CAPS) + bytes(_CONN_CAPS))
            size, = struct.unpack("<Q", _recv(sock, 8))
            if size != _HELLO_RSP:
                raise HypuraError(f"{where}: not a ggml-rpc-server of protocol v{RPC_PROTO_MAJOR} "
                                  f"(hello answered with {size} bytes)")
            major, minor, patch = _recv(sock, _HELLO_RSP)[:3]
    except ConnectionRefusedError:
        raise HypuraError(f"{where}: connection refused (is ggml-rpc-server running there?)") from None
    except socket.timeout:
        raise HypuraError(f"{where}: no answer within {timeout:g} s (unreachable, or serving another client: "
                          f"rpc-server serves one at a time)") from None
    except socket.gaierror as e:
        raise HypuraError(f"{where}: unknown host ({e.strerror})") from None
    except (OSError, ConnectionError) as e:
        raise HypuraError(f"{where}: {getattr(e, 'strerror', None) or e}") from None
    if major != RPC_PROTO_MAJOR or minor > RPC_PROTO_MINOR:
        raise HypuraError(f"{where} speaks RPC protocol v{major}.{minor}.{patch}, this llama.cpp "
                          f"v{RPC_PROTO_MAJOR}.{RPC_PROTO_MINOR}: build both from the same llama.cpp")
    return major, minor, patch


def wait_listening(endpoint: str, timeout: float = 30.0) -> None:
    """Wait until a server just started answers a hello (scripts and tests that start their own); HypuraError
    with the last probe's line after `timeout` seconds."""
    ep = parse_servers(endpoint)[0]
    deadline = time.monotonic() + timeout
    while True:
        try:
            probe(ep, timeout=1.0)
            return
        except HypuraError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


_registered: dict[Endpoint, tuple[str, ...]] = {}  # endpoint -> its device names; llama.cpp's registry is per process


def add_servers(spec: str | Iterable[str], say: Callable[[str], None] = _stderr) -> tuple[str, ...]:
    """Probe every server, then register each as llama.cpp's --rpc does; returns the names of their devices
    (RPC0, RPC1, ...) in order. Probed on every call (a server that answered once may have died since); registered
    once per process."""
    endpoints = parse_servers(spec)
    for ep in endpoints:
        if not ep.loopback:
            say(f"hypura: RPC server {ep} is not on loopback: rpc-server has no authentication, its traffic is "
                "plain TCP")
    for ep in endpoints:
        probe(ep)
    names: list[str] = []
    for ep in endpoints:
        if ep not in _registered:
            _registered[ep] = _register(str(ep))
        names.extend(_registered[ep])
    return tuple(names)


def probe_registered(devices: Iterable[str] | None, but: Iterable[Endpoint] = ()) -> None:
    """Probe each server registered earlier in this process whose devices a load may use (`devices`, llama.cpp's
    list; None: its default, which holds every registered RPC device), `but` those: a dead one is HypuraError's
    one line here, where llama.cpp's client would abort the process."""
    wanted = None if devices is None else set(devices)
    for ep, names in list(_registered.items()):
        if ep not in but and (wanted is None or wanted & set(names)):
            probe(ep)


def _register(endpoint: str) -> tuple[str, ...]:
    from hypura.bindings.ffi import ffi, lib

    L = lib()
    reg = L.ggml_backend_reg_by_name(b"RPC")
    if reg == ffi.NULL:
        raise HypuraError("RPC not supported in this build: run ./build.sh (it builds llama.cpp with -DGGML_RPC=ON)")
    fn = L.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server")
    if fn == ffi.NULL:
        raise HypuraError("this llama.cpp's RPC backend lacks ggml_backend_rpc_add_server")
    server = ffi.cast("ggml_backend_rpc_add_server_t", fn)(endpoint.encode())
    if server == ffi.NULL:
        raise HypuraError(f"RPC server {endpoint}: it offers no devices")
    L.ggml_backend_register(server)
    return tuple(ffi.string(L.ggml_backend_dev_name(L.ggml_backend_reg_dev_get(server, i))).decode()
                 for i in range(L.ggml_backend_reg_dev_count(server)))


@dataclass(frozen=True)
class RpcDevice:
    """One device of an RPC server: its memory as the server reports it (ggml's device memory query) and the
    network link to it, measured with real transfers (ggml_backend_tensor_set / _get on its buffers)."""

    name: str  # llama.cpp's device name: RPC0, RPC1, ...
    endpoint: str
    mem_free: int
    mem_total: int
    link_bw: float  # bytes/s of a large write to the device
    latency_s: float  # one round trip: a 4-byte read
    decode_bw: float  # weight bytes/s of a Q4_K matrix-vector product the server computes (a decode step's kernel)
    method: str


def _dev_by_name(name: str):
    from hypura.bindings.ffi import ffi, lib

    dev = lib().ggml_backend_dev_by_name(name.encode())
    if dev == ffi.NULL:
        raise HypuraError(f"no device {name}")
    return dev


def measure_device(name: str, nbytes: int = LINK_BYTES) -> RpcDevice:
    """The device's free memory, and the link's rate and round trip timed over ggml's synchronous tensor calls
    (each an RPC request that waits for the server's answer)."""
    from hypura.bindings.ffi import ffi, lib

    L = lib()
    dev = _dev_by_name(name)
    free, total = ffi.new("size_t *"), ffi.new("size_t *")
    L.ggml_backend_dev_memory(dev, free, total)
    params = ffi.new("struct ggml_init_params *", {"mem_size": 2 * L.ggml_tensor_overhead(),
                                                   "mem_buffer": ffi.NULL, "no_alloc": True})
    ctx = L.ggml_init(params[0])
    if ctx == ffi.NULL:
        raise HypuraError("ggml_init failed")
    buf = ffi.NULL
    try:
        t = L.ggml_new_tensor_1d(ctx, int(gguf.GGMLQuantizationType.I8), nbytes)
        buf = L.ggml_backend_alloc_ctx_tensors_from_buft(ctx, L.ggml_backend_dev_buffer_type(dev))
        if buf == ffi.NULL:
            raise HypuraError(f"{name}: the server could not allocate {nbytes >> 20} MiB")
        data = np.full(nbytes, 7, dtype=np.uint8)  # not zeros: no transport may shortcut them
        ptr, small = ffi.from_buffer(data), ffi.new("uint8_t[4]")
        link = nbytes / _best(lambda: L.ggml_backend_tensor_set(t, ptr, 0, nbytes), LINK_REPEATS)
        latency = _best(lambda: L.ggml_backend_tensor_get(t, small, 0, 4), LATENCY_REPEATS)
    finally:
        if buf != ffi.NULL:
            L.ggml_backend_buffer_free(buf)
        L.ggml_free(ctx)
    decode = _matvec_rate(dev, MATVEC_BYTES, latency)
    return RpcDevice(name, ffi.string(L.ggml_backend_dev_description(dev)).decode(), free[0], total[0], link,
                     latency, decode,
                     f"memory as the server reports it; link: best of {LINK_REPEATS} writes of {nbytes >> 20} MiB "
                     f"and {LATENCY_REPEATS} 4-byte reads; decode: a {MATVEC_BYTES >> 20} MiB Q4_K matrix times a "
                     f"vector on the server, best of {LINK_REPEATS} of k back to back less one")


def _matvec_rate(dev, nbytes: int, latency: float) -> float:
    """Weight bytes/s of y = W x on the device: W a Q4_K matrix of about `nbytes` (random bytes: the kernel's time
    does not depend on the values), x one f32 vector, computed by the device's backend (the server's threads)."""
    from hypura.bindings.ffi import ffi, lib

    L = lib()
    q4_k = int(gguf.GGMLQuantizationType.Q4_K)
    block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q4_K]
    cols = 4096  # a 7-8B model's n_embd: rows of 16 blocks
    rows = max(1, nbytes // (cols // block * block_bytes))
    params = ffi.new("struct ggml_init_params *", {"mem_size": 4 * L.ggml_tensor_overhead() + L.ggml_graph_overhead(),
                                                   "mem_buffer": ffi.NULL, "no_alloc": True})
    ctx = L.ggml_init(params[0])
    if ctx == ffi.NULL:
        raise HypuraError("ggml_init failed")
    buf, backend = ffi.NULL, ffi.NULL
    try:
        w = L.ggml_new_tensor_2d(ctx, q4_k, cols, rows)
        x = L.ggml_new_tensor_2d(ctx, int(gguf.GGMLQuantizationType.F32), cols, 1)
        y = L.ggml_mul_mat(ctx, w, x)
        graph = L.ggml_new_graph(ctx)
        L.ggml_build_forward_expand(graph, y)
        buf = L.ggml_backend_alloc_ctx_tensors_from_buft(ctx, L.ggml_backend_dev_buffer_type(dev))
        backend = L.ggml_backend_dev_init(dev, ffi.NULL)
        if buf == ffi.NULL or backend == ffi.NULL:
            raise HypuraError("the server could not hold a matrix-vector product")
        w_bytes = L.ggml_nbytes(w)
        data = np.random.default_rng(0).integers(0, 256, w_bytes, dtype=np.uint8)
        L.ggml_backend_tensor_set(w, ffi.from_buffer(data), 0, w_bytes)
        xs = np.ones(cols, dtype=np.float32)
        L.ggml_backend_tensor_set(x, ffi.from_buffer(xs), 0, xs.nbytes)
        out = ffi.new("float[1]")

        def products(k: int) -> float:  # graph_compute does not wait; the read of y waits for the k of them
            def step():
                for _ in range(k):
                    L.ggml_backend_graph_compute(backend, graph)
                L.ggml_backend_tensor_get(y, out, 0, 4)
            return _best(step, LINK_REPEATS)

        return decode_rate(w_bytes, products, latency)
    finally:
        if backend != ffi.NULL:
            L.ggml_backend_free(backend)
        if buf != ffi.NULL:
            L.ggml_backend_buffer_free(buf)
        L.ggml_free(ctx)


def decode_rate(nbytes: int, products: Callable[[int], float], latency: float) -> float:
    """Weight bytes/s of one product of `nbytes` of weights, from `products(k)`: the seconds of k products and the
    read of their result. The difference from one product leaves the round trip out, k growing until it stands
    clear of the round trip's jitter (RESOLVE_S); never above MAX_DECODE_BW."""
    one, k = products(1), 4
    while True:
        many = products(k)
        if many - one >= max(RESOLVE_S, 4 * latency) or k >= MAX_PRODUCTS:
            break
        k = min(4 * k, MAX_PRODUCTS)
    return nbytes / max((many - one) / (k - 1), nbytes / MAX_DECODE_BW)


def _best(fn, repeats: int) -> float:
    fn()  # warm-up: the connection, the server's first touch of its pages
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best
