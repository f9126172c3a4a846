"""llama-completion's console (common/console.cpp) and log (common/log.cpp), for `hypura-cli`.

Output protocol, as in llama.cpp: generated text, the echoed prompt, "> " prompts and the
end-of-generation markers go to stdout (LOG), flushed per token; every log line goes to stderr,
filtered by verbosity (-lv, -v, --log-disable). Input is read a line at a time from stdin.
"""

from __future__ import annotations

import os
import sys
import time
from typing import BinaryIO, Optional

# common/log.h verbosity levels
OUTPUT, ERROR, WARN, INFO, TRACE, DEBUG = 0, 1, 2, 3, 4, 5
_LETTER = {ERROR: "E", WARN: "W", INFO: "I", TRACE: "I", DEBUG: "D"}

# console.cpp display types -> ANSI codes
RESET, PROMPT, USER_INPUT, ERROR_DISPLAY = "\033[0m", "\033[33m", "\033[1m\033[32m", "\033[1m\033[31m"


def tty_can_use_colors() -> bool:
    term = os.environ.get("TERM", "")
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR") and term not in ("", "dumb")


class Console:
    def __init__(self, verbosity: int = INFO, log_disable: bool = False, color: Optional[bool] = None,
                 simple_io: bool = False, stdin: Optional[BinaryIO] = None):
        self.verbosity = verbosity
        self.log_disable = log_disable
        self.color = tty_can_use_colors() if color is None else color
        self.simple_io = simple_io
        self.stdin = stdin if stdin is not None else sys.stdin.buffer
        self.stdout = sys.stdout.buffer
        self.stderr = sys.stderr  # held: loading the model silences sys.stderr for llama_cpp's prints
        self._display = RESET
        self._t0 = time.monotonic()
        self._echo: Optional[BinaryIO] = None

    # --- stdout ---------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        # llama.cpp's LOG() goes through the same paused logger: --log-disable silences stdout too
        if data and not self.log_disable:
            self.stdout.write(data)
            self.stdout.flush()

    def set_display(self, code: str) -> None:
        if self.color and code != self._display and not self.log_disable:
            self.write(code.encode())
            self._display = code

    # --- stderr ---------------------------------------------------------------------------------
    def log(self, level: int, text: str, prefix: bool = True) -> None:
        if self.log_disable or level > self.verbosity:
            return
        if prefix and level in _LETTER:
            us = int((time.monotonic() - self._t0) * 1e6)
            text = f"{us // 60_000_000}.{us // 1_000_000 % 60:02d}.{us // 1000 % 1000:03d}.{us % 1000:03d} " \
                   f"{_LETTER[level]} {text}"
        self.stderr.write(text)
        self.stderr.flush()

    def inf(self, text: str) -> None:
        self.log(INFO, text)

    def wrn(self, text: str) -> None:
        self.log(WARN, text)

    def err(self, text: str) -> None:
        self.log(ERROR, text)

    def dbg(self, text: str) -> None:
        self.log(DEBUG, text)

    # --- stdin ----------------------------------------------------------------------------------
    def readline(self, multiline_input: bool) -> tuple[bytes, bool]:
        """console::readline: one line with its '\\n'; b"" at end of input. A line ending in '/'
        returns control at once; one ending in '\\' flips multi-line input. Returns (line, more)."""
        raw = self.stdin.readline()
        if not raw:
            return b"", False
        at_eof = not raw.endswith(b"\n")
        line = raw[:-1] if not at_eof else raw
        if not self.simple_io and not self.stdin.isatty():
            self._echo_input(line, at_eof)
        if line.endswith(b"/"):
            return line[:-1] + b"\n", False
        if line.endswith(b"\\"):
            line = line[:-1]
            multiline_input = not multiline_input
        elif at_eof and not self.simple_io:
            return line, False  # readline_advanced: end of stream, no newline added
        return line + b"\n", multiline_input

    def _echo_input(self, line: bytes, at_eof: bool) -> None:
        """Without --simple-io llama.cpp reads keys itself and echoes them: to /dev/tty when it
        can open it, else to stdout (piped input in scripts shows up in their output)."""
        if self._echo is None:
            try:
                self._echo = open("/dev/tty", "wb", buffering=0)
            except OSError:
                self._echo = self.stdout
        text = line[:-1] if line.endswith((b"/", b"\\")) else line
        end = b"" if at_eof or line.endswith(b"/") else b"\n"
        self._echo.write(text + end)
        self._echo.flush()
