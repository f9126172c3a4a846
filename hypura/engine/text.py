"""Generated tokens as text, released as soon as it is final: bytes of a UTF-8 character split over
tokens wait for the rest, and text that may still begin a stop string waits until it does or cannot."""

from __future__ import annotations

import codecs
from typing import Callable


class TextStream:
    def __init__(self, piece: Callable[[int], bytes], stop: tuple[str, ...] = ()):
        self._piece = piece
        self._stop = stop
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""  # everything decoded so far (cut at a stop string once one is found)
        self._sent = 0  # text[:_sent] is released; no stop string starts there (held back otherwise)
        self.stopped = False

    def push(self, token: int) -> str:
        """The text `token` releases (often "", while bytes or a possible stop string wait)."""
        new = self._utf8.decode(self._piece(token))
        if not self._stop:  # nothing is held back: what is decoded is released (as _release would)
            self.text += new
            self._sent = len(self.text)
            return new
        self.text += new
        return self._release()

    def flush(self) -> str:
        """At the end: the rest of the text, incomplete bytes as U+FFFD, stop strings still cut."""
        self.text += self._utf8.decode(b"", final=True)
        return self._release(final=True)

    def _release(self, final: bool = False) -> str:
        if self.stopped:
            return ""
        start = self._sent
        hits = [i for i in (self.text.find(s, start) for s in self._stop) if i >= 0]
        if hits:
            self.text, self.stopped = self.text[: min(hits)], True
            end = len(self.text)
        else:
            end = len(self.text) - (0 if final else self._held())
        self._sent = end
        return self.text[start:end]

    def _held(self) -> int:
        """Length of the longest unreleased tail that is the start of a stop string."""
        tail = self.text[self._sent:]
        return max((k for s in self._stop for k in range(min(len(s) - 1, len(tail)), 0, -1)
                    if tail.endswith(s[:k])), default=0)
