"""Copies of a model whose file changed while loaded ("retired"): out of the registry's entries, they serve the
requests that leased them to their end, then are closed.

The bound: a model has at most one retired copy still serving. A further change, found while it serves, waits:
the requests that find it wait until that copy's requests have ended (Registry.acquire, within LOAD_WAIT_S),
then retire the copy loaded now and load the file again once the idle retired copy is closed. So at most two
copies of a model are held (the one retired, the one serving), a file changing faster than requests end costs
no more memory than one change, no request is cut short, and each request is served from the file as it was
when its wait ended.

Concurrency: every method is called under the registry's `_lock`. A waiter's future is resolved under it, when
the retired copy's last lease is released, and awaited outside it (asyncio.wrap_future), as a load is.
"""

from __future__ import annotations

import concurrent.futures
from typing import Optional

from hypura.serve.models.entry import ModelEntry


class Retired:
    def __init__(self):
        self._copies: list[ModelEntry] = []
        self._drained: dict[str, concurrent.futures.Future] = {}  # name -> set when its retired copy serves none

    def add(self, entry: ModelEntry) -> None:
        entry.retired = True
        self._copies.append(entry)

    def serving(self, name: str) -> Optional[concurrent.futures.Future]:
        """A future set once `name`'s retired copy serves no request; None when none serves one now."""
        if not any(e.name == name and e.leases > 0 for e in self._copies):
            return None
        return self._drained.setdefault(name, concurrent.futures.Future())

    def released(self, entry: ModelEntry) -> None:
        """`entry` lost a lease: its waiters go on once it was a retired copy's last."""
        if entry.retired and entry.leases == 0 and entry.name in self._drained:
            self._drained.pop(entry.name).set_result(None)

    def any_idle(self) -> bool:
        return any(e.leases == 0 for e in self._copies)

    def take_idle(self) -> list[ModelEntry]:
        """The copies no request uses any more, taken out to be closed."""
        idle = [e for e in self._copies if e.leases == 0]
        self._copies = [e for e in self._copies if e.leases > 0]
        return idle

    def take_all(self) -> list[ModelEntry]:
        """Every copy, taken out to be closed (the server stops); its waiters go on, to find it stopping."""
        copies, self._copies = self._copies, []
        for future in self._drained.values():
            future.set_result(None)
        self._drained.clear()
        return copies

    def __iter__(self):
        return iter(list(self._copies))

    def __len__(self) -> int:
        return len(self._copies)
