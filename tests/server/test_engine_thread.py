"""The engine thread on the fake runtime: commands that raise, a crash, and the queue bound."""

from __future__ import annotations

import threading

import pytest

from engines import fake_engine
from runner.sampling.params import SamplingParams
from runner.scheduler.request import FinishReason, GenerationRequest, StreamEvent
from runner.scheduler.scheduler import QueueFullError
from runner.server.engine_thread import SHUTTING_DOWN, EngineStoppedError, EngineThread


class Inbox:
    """A sink that lets the test wait for a request's final event."""

    def __init__(self) -> None:
        self.events: list[StreamEvent] = []
        self.done = threading.Event()

    def __call__(self, event: StreamEvent) -> None:
        self.events.append(event)
        if event.is_final:
            self.done.set()

    def final(self) -> StreamEvent:
        assert self.done.wait(30), "the request never ended"
        return self.events[-1]


def request(rid: str, max_tokens: int = 3) -> GenerationRequest:
    return GenerationRequest(rid, (5, 6, 7), SamplingParams(temperature=0), max_tokens)


def started(engine) -> tuple[EngineThread, list[BaseException]]:
    """An engine thread running `engine`, and the errors it reports."""
    errors: list[BaseException] = []
    thread = EngineThread(engine, on_error=errors.append)
    thread.start()
    return thread, errors


def test_a_submit_that_raises_fails_alone_and_the_engine_keeps_serving() -> None:
    engine, _ = fake_engine(n_slots=1)
    real_submit = engine.submit_group

    def submit_group(reqs, sinks):  # fault injection: this request breaks inside the engine thread
        if reqs[0].request_id == "bad":
            raise KeyError("boom")
        return real_submit(reqs, sinks)

    engine.submit_group = submit_group
    thread, errors = started(engine)
    try:
        bad, good = Inbox(), Inbox()
        thread.submit(request("bad"), bad)
        thread.submit(request("good"), good)
        assert bad.final().finish_reason is FinishReason.ERROR and "boom" in bad.final().error
        assert good.final().finish_reason is FinishReason.LENGTH
        assert [t for e in good.events for t in e.token_ids] == [8, 9, 10]
        assert thread.is_alive and len(errors) == 1
        finished = dict(thread.snapshot().n_finished)  # (the refused submit was not counted)
        assert (finished["error"], finished["length"]) == (1, 1)
    finally:
        thread.stop()


def test_a_crashed_engine_thread_fails_what_is_in_flight_and_says_so() -> None:
    engine, rt = fake_engine(n_slots=1)
    crash = threading.Event()
    real_decode = rt.decode

    def decode(rows):
        if crash.is_set():
            raise SystemExit("the runtime is gone")  # not an Exception: the step's handler lets it through
        return real_decode(rows)

    rt.decode = decode
    thread, errors = started(engine)
    try:
        running, waiting = Inbox(), Inbox()
        crash.set()
        thread.submit(request("running", 50), running)
        thread.submit(request("waiting", 50), waiting)
        for inbox in (running, waiting):
            final = inbox.final()
            assert final.finish_reason is FinishReason.ERROR and "the engine stopped" in final.error
        assert not thread.is_alive and len(errors) == 1
        with pytest.raises(EngineStoppedError):
            thread.submit(request("late"), Inbox())
    finally:
        thread.stop()


def test_cancels_waiting_in_the_inbox_are_not_counted_as_queued_requests() -> None:
    engine, _ = fake_engine(n_slots=1, max_queue=2)
    thread = EngineThread(engine)  # not started: commands stay in the inbox
    for i in range(50):
        thread.cancel(f"gone-{i}")
    for i in range(3):  # one takes the free slot, two may wait
        thread.submit(request(f"r{i}"), Inbox())
    assert thread.n_waiting == 3
    with pytest.raises(QueueFullError):
        thread.submit(request("r3"), Inbox())


def test_cancel_all_ends_every_request() -> None:
    engine, _ = fake_engine(n_slots=1)
    thread = EngineThread(engine)
    inboxes = [Inbox() for _ in range(3)]
    for i, inbox in enumerate(inboxes):
        thread.submit(request(f"r{i}", 10_000), inbox)
    thread.cancel_all()
    thread.start()
    try:
        assert [(i.final().finish_reason, i.final().error) for i in inboxes] == [
            (FinishReason.CANCELLED, SHUTTING_DOWN)] * 3  # (a client still reading is told why)
    finally:
        thread.stop()
