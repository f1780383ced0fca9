"""The engine on its own thread: the one owner of the llama.cpp context and every slot.

Other threads only post commands (submit, cancel, snapshot) into an inbox and never read the
scheduler's or the speculator's state; events go back through each request's sink (the server's
sink hops onto the asyncio loop with call_soon_threadsafe). After each pass the engine thread
publishes how full its queue is, so that a submit is refused at once when --max-queue is reached.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TypeVar

from runner.core.errors import RunnerError
from runner.scheduler.engine import Engine
from runner.scheduler.request import (
    EventSink,
    FinishReason,
    GenerationRequest,
    StreamEvent,
)
from runner.scheduler.scheduler import QueueFullError
from runner.scheduler.snapshot import EngineSnapshot

T = TypeVar("T")

SNAPSHOT_TIMEOUT_S = 30.0  # a step can be long (a big prompt chunk on a slow CPU); past this, something is stuck


class EngineStoppedError(RunnerError):
    """The engine thread has stopped: no request can be served."""


@dataclass(frozen=True)
class _Submit:
    requests: list[GenerationRequest]  # one, or a request's n choices (submitted together)
    sinks: list[EventSink]


SHUTTING_DOWN = "the server is shutting down: this request was cancelled before its reply ended"


class EngineThread:
    def __init__(self, engine: Engine, on_error: Callable[[BaseException], None] | None = None) -> None:
        self.engine = engine
        self.max_queue = engine.scheduler.max_queue
        self._inbox: deque[_Submit | Callable[[], None]] = deque()
        self._n_arriving = 0  # requests submitted and not yet counted in the published queue below
        self._n_queued = 0  # published by the engine thread: requests waiting for a slot ...
        self._n_free = len(engine.scheduler.pool.slots)  # ... and slots free for them
        self._wake = threading.Condition()
        self._stopping = False
        self._on_error = on_error
        self.crash: BaseException | None = None  # what stopped the thread, if anything did
        self._thread = threading.Thread(target=self._run, name="runner-engine", daemon=True)
        self.started_s = time.time()

    def start(self) -> None:
        self._thread.start()

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive() and self.crash is None

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout=30)

    # -- called from other threads ----------------------------------------------------------
    def submit(self, request: GenerationRequest, sink: EventSink) -> None:
        """Queue a request; raises QueueFullError when --max-queue requests already wait."""
        self.submit_groups([[request]], [[sink]])

    def submit_groups(self, groups: list[list[GenerationRequest]], sinks: list[list[EventSink]]) -> None:
        """Queue groups (each one request, or one prompt's n choices, whose prompt is computed once:
        Engine.submit_group), all or none. Each prompt's length was checked at the edge
        (model.prompt_limits); the scheduler checks again."""
        n_requests = sum(len(group) for group in groups)
        with self._wake:
            if self.crash is not None or self._stopping:
                raise EngineStoppedError("the engine has stopped (see the server's log); restart the server")
            if self._n_queued + self._n_arriving + n_requests - 1 - self._n_free >= self.max_queue:
                raise QueueFullError(f"the queue is full ({self.max_queue} generations waiting: each choice, beam and "
                                     "prompt of a request is one)")
            self._n_arriving += n_requests
            self._inbox.extend(_Submit(list(group), list(group_sinks)) for group, group_sinks in zip(groups, sinks,
                                                                                                      strict=True))
            self._wake.notify()

    def cancel(self, request_id: str) -> None:
        self._post(lambda: self.engine.cancel(request_id))

    def cancel_all(self) -> None:
        """Cancel every request, waiting or running (shutdown): each ends with SHUTTING_DOWN as its
        error, so a client still reading is not told its reply ended whole."""
        self._post(lambda: self.engine.scheduler.cancel_all(SHUTTING_DOWN))

    def snapshot(self) -> EngineSnapshot:
        """The engine's counters and slot table, built by the engine thread between two steps."""
        return self.call(self.engine.snapshot)

    def call(self, fn: Callable[[], T]) -> T:
        """fn's result, run by the engine thread between two steps (here when it is not running)."""
        if not self._thread.is_alive():  # not started, or ended: nothing else touches the engine now
            return fn()
        future: Future[T] = Future()

        def answer() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - the asking thread raises it
                future.set_exception(exc)

        self._post(answer)
        return future.result(timeout=SNAPSHOT_TIMEOUT_S)

    @property
    def n_waiting(self) -> int:
        """Requests waiting for a slot, the ones still in the inbox included (as last published)."""
        with self._wake:
            return self._n_arriving + self._n_queued

    # -- the engine thread ------------------------------------------------------------------
    def _post(self, command: Callable[[], None]) -> None:
        with self._wake:
            self._inbox.append(command)
            self._wake.notify()

    def _run_command(self, command: _Submit | Callable[[], None]) -> None:
        """One inbox command; one that raises is reported and fails only its own request."""
        if not isinstance(command, _Submit):
            try:
                command()
            except Exception as exc:  # noqa: BLE001 - a cancel or probe must not take the engine down
                self._report(exc)
            return
        try:
            self.engine.submit_group(command.requests, command.sinks)
        except QueueFullError as exc:  # the queue filled between the check and now
            self._fail_unsubmitted(command, str(exc))
        except Exception as exc:  # noqa: BLE001
            self._report(exc)
            self._fail_unsubmitted(command, f"internal error: {exc}")

    def _fail_unsubmitted(self, command: _Submit, message: str) -> None:
        """End a submit the engine refused, counted as the engine counts its own failures."""
        self.engine.stats.n_finished[FinishReason.ERROR] += len(command.requests)
        _fail(command, message)

    def _report(self, exc: BaseException) -> None:
        if self._on_error:
            self._on_error(exc)

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - reported once; /health says so from now on
            self._crashed(exc)

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._inbox and not self.engine.has_work and not self._stopping:
                    self._wake.wait()
                if self._stopping:
                    return
                commands = list(self._inbox)
                self._inbox.clear()
            for command in commands:
                self._run_command(command)
            try:
                self.engine.step()
            except Exception as exc:  # noqa: BLE001 - keep serving; the failing step's requests get the error
                self._report(exc)
                self.engine.scheduler.fail_all(f"internal error: {exc}")
            self._publish_queue(sum(len(c.requests) for c in commands if isinstance(c, _Submit)) if commands else 0)

    def _publish_queue(self, n_taken: int) -> None:
        """How full the queue is now, with the submits just taken from the inbox moved into it."""
        scheduler = self.engine.scheduler
        with self._wake:
            self._n_queued, self._n_free = scheduler.n_waiting, len(scheduler.pool.slots) - scheduler.pool.n_busy
            self._n_arriving -= n_taken

    def _crashed(self, exc: BaseException) -> None:
        """The thread is ending on an error: fail whatever is in flight or waiting, so nobody hangs."""
        with self._wake:
            self.crash = exc
            pending = [c for c in self._inbox if isinstance(c, _Submit)]
            self._inbox.clear()
        self._report(exc)
        message = f"internal error: the engine stopped ({exc!r})"
        for command in pending:
            _fail(command, message)
        try:
            self.engine.scheduler.fail_all(message)
        except Exception:  # noqa: BLE001 - the state that broke may break this too; the sinks above still ran
            pass


def _fail(command: _Submit, message: str) -> None:
    for request, sink in zip(command.requests, command.sinks, strict=True):
        sink(StreamEvent(request.request_id, "", finish_reason=FinishReason.ERROR, error=message))
