"""Hand engine events to the asyncio loop with one wake-up per burst, not one per token.

call_soon_threadsafe writes to the loop's self-pipe on every call; with many slots that is a
syscall and a loop wake-up per token. The pump batches whatever arrives before the loop runs.
"""

from __future__ import annotations

import asyncio
import threading

from runner.request import EventSink, StreamEvent


class EventPump:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._pending: list[tuple[asyncio.Queue[StreamEvent], StreamEvent]] = []
        self._is_scheduled = False

    def sink_for(self, queue: asyncio.Queue[StreamEvent]) -> EventSink:
        def sink(event: StreamEvent) -> None:  # runs on the engine thread
            with self._lock:
                self._pending.append((queue, event))
                if self._is_scheduled:
                    return
                self._is_scheduled = True
            self._loop.call_soon_threadsafe(self._deliver)

        return sink

    def _deliver(self) -> None:  # runs on the event loop
        with self._lock:
            pending, self._pending, self._is_scheduled = self._pending, [], False
        for queue, event in pending:
            queue.put_nowait(event)
