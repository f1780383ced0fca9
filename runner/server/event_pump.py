"""Hand engine events to the asyncio loop without waking it for every token.

Waking the loop from the engine thread (call_soon_threadsafe: a write to the loop's self-pipe)
is a cross-thread wake-up inside the engine's step, and the loop's work then takes a core from
llama_decode (docs/benchmarks.md, "Findings"). So with an interval, the loop collects events on its own timer, which
costs the engine nothing; the engine wakes it only for a request's first event (time to first
token), a last event (the end of a reply), and the first event after the timer stopped (it
stops after a tick that found nothing). Whatever is pending when the loop runs, for every
request, is delivered in one go. interval_s = 0 wakes the loop for every event.
"""

from __future__ import annotations

import asyncio
import threading

from runner.scheduler.request import EventSink, StreamEvent


class EventPump:
    def __init__(self, loop: asyncio.AbstractEventLoop, interval_s: float = 0.0) -> None:
        self._loop = loop
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._pending: list[tuple[asyncio.Queue[StreamEvent], StreamEvent]] = []
        self._is_scheduled = False  # a _deliver is on its way to the loop
        self._is_ticking = False  # the loop's timer will collect what the engine leaves here
        self._timer: asyncio.TimerHandle | None = None  # loop side only

    def sink_for(self, queue: asyncio.Queue[StreamEvent]) -> EventSink:
        is_first = True

        def sink(event: StreamEvent) -> None:  # runs on the engine thread
            nonlocal is_first
            with self._lock:
                self._pending.append((queue, event))
                wakes = is_first or event.is_final or not self._is_ticking
                is_first = False
                if self._is_scheduled or not wakes:
                    return
                self._is_scheduled = True
                self._is_ticking = self._interval_s > 0
            self._loop.call_soon_threadsafe(self._deliver)

        return sink

    def _deliver(self) -> None:  # runs on the event loop
        with self._lock:
            pending, self._pending, self._is_scheduled = self._pending, [], False
        for queue, event in pending:
            queue.put_nowait(event)
        if self._interval_s > 0 and self._timer is None:
            self._timer = self._loop.call_later(self._interval_s, self._tick)

    def _tick(self) -> None:  # runs on the event loop
        self._timer = None
        with self._lock:
            if not self._pending:
                self._is_ticking = False  # the engine's next event wakes the loop itself
                return
        self._deliver()
