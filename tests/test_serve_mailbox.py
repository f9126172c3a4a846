"""The mailbox between engine threads and the server's loop (hypura/serve/generate/mailbox.py): every event
posted from other threads reaches its stream, in posting order per stream, however the posts and the loop's
drains interleave."""

from __future__ import annotations

import asyncio
import threading

from hypura.engine import Event
from hypura.serve.generate.mailbox import mailbox


class _Stream:
    def __init__(self):
        self.got: list[Event] = []
        self.done = asyncio.Event()

    def _deliver(self, event: Event) -> None:
        self.got.append(event)
        if event.finish_reason is not None:
            self.done.set()


def test_posts_from_threads_arrive_in_order_per_stream():
    n = 2000

    async def main():
        box, streams = mailbox(), [_Stream() for _ in range(3)]
        assert mailbox() is box  # one per loop

        def engine(stream):
            for i in range(n):
                box.post(stream, Event(text=str(i), token=i))
            box.post(stream, Event(text="", finish_reason="stop"))

        threads = [threading.Thread(target=engine, args=(s,)) for s in streams]
        for t in threads:
            t.start()
        await asyncio.wait_for(asyncio.gather(*(s.done.wait() for s in streams)), 60)
        for t in threads:
            t.join()
        return streams

    for stream in asyncio.run(main()):
        assert [e.token for e in stream.got[:-1]] == list(range(n)) and stream.got[-1].finish_reason == "stop"
