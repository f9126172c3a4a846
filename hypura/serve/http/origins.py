"""Who may call the server from where: the Host allow-list, the Origin check and CORS, as Ollama since
CVE-2024-28224.

- Host: a DNS-rebinding page reaches 127.0.0.1 under a name of its own (`Host: rebind.evil.example`), so a
  request is served only when its Host is a loopback address or `localhost` (`*.localhost`), this
  machine's own name, the `--host` value, or a name of `--allowed-hosts` (`*` allows any). A server
  listening on every address (`0.0.0.0`, `::`) also answers any IP address: rebinding needs a name.
- Origin: browsers send it on every cross-origin request, and a `text/plain` POST needs no preflight, so a
  request whose Origin is not allowed is refused before any work. Allowed: loopback origins of any port and
  the desktop-app schemes Ollama allows (`app://`, `file://`, `tauri://`, `vscode-webview://`), and each
  `--cors-origin` (a `*` in it matches anything: `http://192.168.1.5:*`; `*` alone allows every origin).
  Requests without an Origin (curl, SDKs) are not browsers' and pass.
- CORS: a preflight (OPTIONS with Access-Control-Request-Method) from an allowed origin answers 204 with
  Access-Control-Allow-Origin/Methods/Headers; every answer to an allowed origin carries
  Access-Control-Allow-Origin, so the page can read it.
"""

from __future__ import annotations

import fnmatch
import functools
import ipaddress
import socket
from dataclasses import dataclass
from typing import Optional

LOOPBACK_NAMES = ("localhost",)
# Ollama's default origins: loopback web pages and desktop apps' own schemes
DEFAULT_ORIGINS = ("http://localhost", "https://localhost", "http://localhost:*", "https://localhost:*",
                   "http://127.0.0.1", "https://127.0.0.1", "http://127.0.0.1:*", "https://127.0.0.1:*",
                   "http://[::1]", "https://[::1]", "http://[::1]:*", "https://[::1]:*",
                   "app://*", "file://*", "tauri://*", "vscode-webview://*", "vscode-file://*")
ALLOW_METHODS = "GET, POST, DELETE, OPTIONS"
PREFLIGHT_MAX_AGE_S = "600"
MAX_HEADER_CHARS = 1000  # Access-Control-Request-Headers reflected back at most this long


def _ip(host: str) -> Optional[ipaddress._BaseAddress]:
    try:
        return ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return None


@functools.lru_cache(maxsize=1)
def _this_machine() -> tuple[str, ...]:
    """This machine's own names (a rebinding page cannot make them resolve to anything)."""
    name = socket.gethostname().lower()
    return (name, f"{name}.local") if name else ()


def host_name(header: str) -> str:
    """The name or address of a Host header, without its port, lower case."""
    header = header.strip().lower()
    if header.startswith("["):  # [::1]:11434
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


@dataclass(frozen=True)
class Origins:
    """The Host and Origin rules of one server (from --host, --allowed-hosts and --cors-origin)."""

    host: str  # --host: the address listened on
    allowed_hosts: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()

    def host_allowed(self, header: Optional[str]) -> bool:
        if not header:  # HTTP/1.0 without Host: no browser sends that
            return True
        name = host_name(header)
        if "*" in self.allowed_hosts or name in LOOPBACK_NAMES or name.endswith(".localhost"):
            return True
        if name in (self.host.lower().strip("[]"), *(h.lower() for h in self.allowed_hosts), *_this_machine()):
            return True
        ip = _ip(name)
        listen = _ip(self.host)
        return ip is not None and (ip.is_loopback or (listen is not None and listen.is_unspecified))

    def origin_allowed(self, origin: str) -> bool:
        origin = origin.strip().lower().rstrip("/")
        return any(fnmatch.fnmatchcase(origin, pattern.lower().rstrip("/"))
                   for pattern in (*DEFAULT_ORIGINS, *self.cors_origins))


def cors_headers(origin: str) -> list[tuple[bytes, bytes]]:
    """Headers that let a page of `origin` (allowed) read an answer."""
    return [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]


def preflight_headers(origin: str, requested: str) -> list[tuple[bytes, bytes]]:
    """The 204 to a preflight of an allowed origin: the methods served and the headers it asked for."""
    asked = requested[:MAX_HEADER_CHARS] or "Authorization, Content-Type"
    return cors_headers(origin) + [(b"access-control-allow-methods", ALLOW_METHODS.encode()),
                                   (b"access-control-allow-headers", asked.encode("latin-1")),
                                   (b"access-control-max-age", PREFLIGHT_MAX_AGE_S.encode())]
