"""llama.cpp's error log lines during a call, kept to say why the call failed.

llama.cpp reports why a model did not load only in its log (`gguf_init_from_file_impl: tensor 'x'
has offset 5, expected 0`, `llama_model_load: error loading model: ...`); llama-cpp-python then
raises a bare `ValueError: Failed to load model from file`, and with verbose=False the log went to
/dev/null. `LogCapture` installs a callback through llama_log_set for the duration of a `with`
block: error lines (and their continuations) are held back, every other line goes on to the
callback that was installed before (restored on exit). `reason()` is the first error, one line.
After a call that succeeded, `replay()` passes the held lines on as they would have gone.

llama_log_set is process-wide: lines logged by other threads meanwhile are held or passed on too.
"""

from __future__ import annotations

import ctypes
import os
import re
from typing import Optional

import llama_cpp

from hypura.errors import HypuraError, ModelFileError
from hypura.modelfile.problems import clip

GGML_LOG_LEVEL_ERROR, GGML_LOG_LEVEL_CONT = 4, 5  # ggml.h enum ggml_log_level
MAX_REASON = 240  # characters of llama.cpp's message kept in an exception
# "func: " prefixes and llama.cpp's own wrappers around the message that says what is wrong
_PREFIX = re.compile(r"^(?:\w+: )?(?:error loading model: )?")


class LogCapture:
    """llama.cpp's log during a `with` block: errors held (errors, reason()), the rest passed on."""

    def __init__(self):
        self.errors: list[tuple[int, bytes]] = []
        self._last_level = 0
        self._prev = llama_cpp.llama_log_callback()
        self._prev_data = ctypes.c_void_p()
        self._callback = llama_cpp.llama_log_callback(self._log)  # kept alive while installed

    def __enter__(self) -> "LogCapture":
        llama_cpp.llama_log_get(ctypes.byref(self._prev), ctypes.byref(self._prev_data))
        llama_cpp.llama_log_set(self._callback, ctypes.c_void_p(0))
        return self

    def __exit__(self, *exc) -> None:
        llama_cpp.llama_log_set(self._prev, self._prev_data)

    def _log(self, level: int, text: bytes, _user_data) -> None:
        if level == GGML_LOG_LEVEL_ERROR or (level == GGML_LOG_LEVEL_CONT and self._last_level == GGML_LOG_LEVEL_ERROR):
            self.errors.append((level, text))
        else:
            self._forward(level, text)
        if level != GGML_LOG_LEVEL_CONT:
            self._last_level = level

    def _forward(self, level: int, text: bytes) -> None:
        if self._prev:
            self._prev(level, text, self._prev_data)
        else:  # no callback: ggml's default writes to stderr
            os.write(2, text)

    def replay(self) -> None:
        for level, text in self.errors:
            self._forward(level, text)
        self.errors.clear()

    def reason(self) -> Optional[str]:
        """The first error llama.cpp logged, without its function prefix, printable, one line."""
        lines = b"".join(text for _, text in self.errors).decode("utf-8", errors="replace").splitlines()
        lines = [line.strip() for line in lines if line.strip()]
        if not lines:
            return None
        return clip(_PREFIX.sub("", lines[0]), MAX_REASON)

    def failure(self, exc: BaseException, model_path) -> Optional[Exception]:
        """A clearer exception for a load llama-cpp-python reported without its reason, else None."""
        reason = self.reason()
        if reason is None or not isinstance(exc, ValueError) or isinstance(exc, HypuraError):
            return None
        if str(exc).startswith("Failed to load model"):
            return ModelFileError(f"{model_path}: {reason}")
        if str(exc).startswith("Failed to create llama_context"):
            return ValueError(f"{model_path}: cannot create a context: {reason}")
        return None
