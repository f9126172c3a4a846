"""An HTTP server a benchmark drives (`hypura serve` or llama-server): started, waited for, stopped, its log kept.

    server = ServerProcess(command)
    with server:                      # started; terminated at the end (killed after 30 s)
        model = wait_model(client, server.process, timeout_s)
    server.log                        # what it printed, stdout and stderr, once stopped
"""

from __future__ import annotations

import socket
import subprocess
import tempfile
import time

try:
    import httpx
except ImportError:  # the GPU machine's wheels (bench/device_prep.sh) carry the openai client's httpx2
    import httpx2 as httpx


class ServerProcess:
    def __init__(self, command: list[str]):
        self.command, self.process, self.log = command, None, ""

    def __enter__(self) -> "ServerProcess":
        self._file = tempfile.TemporaryFile()
        self.process = subprocess.Popen(self.command, stdout=self._file, stderr=subprocess.STDOUT)
        return self

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self._file.seek(0)
        self.log = self._file.read().decode(errors="replace")
        self._file.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_model(client, server: subprocess.Popen, timeout_s: float) -> str:
    """The served model's name, once /v1/models lists it (`client`: an httpx.Client on the server)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode}")
        try:
            reply = client.get("/v1/models", timeout=2)
            if reply.status_code == 200 and reply.json().get("data"):
                return reply.json()["data"][0]["id"]
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the server did not answer /v1/models in time")
