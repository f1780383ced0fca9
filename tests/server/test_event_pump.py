"""When the engine thread wakes the event loop, and when the loop's own timer collects events."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from runner.scheduler.request import FinishReason, StreamEvent
from runner.server.event_pump import EventPump


class RecordingLoop:
    """Stands in for the asyncio loop: records what the pump asks of it; the test runs it."""

    def __init__(self) -> None:
        self.wakes: list[Callable[[], None]] = []  # call_soon_threadsafe: the engine waking the loop
        self.timers: list[tuple[float, Callable[[], None]]] = []

    def call_soon_threadsafe(self, fn: Callable[[], None]) -> None:
        self.wakes.append(fn)

    def call_later(self, delay: float, fn: Callable[[], None]) -> object:
        self.timers.append((delay, fn))
        return object()

    def run_wakes(self) -> None:
        wakes, self.wakes = self.wakes, []
        for fn in wakes:
            fn()

    def run_timer(self) -> None:
        (_, fn), = self.timers
        self.timers = []
        fn()


def event(text: str, final: bool = False) -> StreamEvent:
    return StreamEvent("r", text, finish_reason=FinishReason.STOP if final else None)


def drain(queue: asyncio.Queue[StreamEvent]) -> list[str]:
    out = []
    while not queue.empty():
        out.append(queue.get_nowait().text)
    return out


def test_with_an_interval_the_engine_wakes_the_loop_only_for_first_and_last_events() -> None:
    loop = RecordingLoop()
    pump = EventPump(loop, interval_s=0.02)  # type: ignore[arg-type]
    first_q: asyncio.Queue[StreamEvent] = asyncio.Queue()
    first = pump.sink_for(first_q)

    first(event("a"))  # a reply's first token: at once
    assert len(loop.wakes) == 1
    loop.run_wakes()
    assert drain(first_q) == ["a"]
    assert [delay for delay, _ in loop.timers] == [0.02]  # from now on the loop's timer collects

    first(event("b"))
    first(event("c"))
    assert loop.wakes == []  # no wake-up per token
    loop.run_timer()
    assert drain(first_q) == ["b", "c"]

    second_q: asyncio.Queue[StreamEvent] = asyncio.Queue()
    second = pump.sink_for(second_q)
    second(event("x"))  # another request's first token does not wait for the timer
    assert len(loop.wakes) == 1
    loop.run_wakes()
    assert drain(second_q) == ["x"]

    loop.run_timer()  # nothing pending: the timer stops ...
    assert loop.timers == []
    first(event("d"))  # ... and the next event wakes the loop itself, which restarts it
    assert len(loop.wakes) == 1
    loop.run_wakes()
    assert drain(first_q) == ["d"] and len(loop.timers) == 1

    first(event("e"))
    first(event("f", final=True))  # the end of a reply: at once, with what waited before it
    assert len(loop.wakes) == 1
    loop.run_wakes()
    assert drain(first_q) == ["e", "f"]


def test_without_an_interval_every_event_wakes_the_loop_once() -> None:
    loop = RecordingLoop()
    pump = EventPump(loop, interval_s=0.0)  # type: ignore[arg-type]
    queue: asyncio.Queue[StreamEvent] = asyncio.Queue()
    sink = pump.sink_for(queue)
    for text in "abc":
        sink(event(text))
        assert len(loop.wakes) == 1
        loop.run_wakes()
    sink(event("d"))
    sink(event("e"))  # a wake-up already on its way carries this one too
    assert len(loop.wakes) == 1
    loop.run_wakes()
    assert drain(queue) == list("abcde")
    assert loop.timers == []
