"""The engine on its own thread: the one owner of the llama.cpp context and every slot.

Other threads only post commands (submit, cancel) into an inbox; events go back through
each request's sink (the server's sink hops onto the asyncio loop with call_soon_threadsafe).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from runner.scheduler.engine import Engine
from runner.scheduler.request import EventSink, FinishReason, GenerationRequest, StreamEvent
from runner.errors import RunnerError
from runner.scheduler.scheduler import QueueFullError


class EngineStoppedError(RunnerError):
    """The engine thread has stopped: no request can be served."""


@dataclass(frozen=True)
class SlotView:
    id: int
    state: str
    request_id: str | None
    n_cached: int
    n_generated: int
    n_prompt: int
    n_prompt_reused: int
    draft_k: int  # drafts verified in this slot's last step
    draft_acceptance: float | None  # accepted / proposed for the current (or last) request


@dataclass(frozen=True)
class _Submit:
    requests: list[GenerationRequest]  # one, or a request's n choices (submitted together)
    sinks: list[EventSink]


class EngineThread:
    def __init__(self, engine: Engine, on_error: Callable[[BaseException], None] | None = None) -> None:
        self.engine = engine
        self._inbox: deque[_Submit | Callable[[], None]] = deque()
        self._n_arriving = 0  # submits in the inbox (cancels there wait for no slot)
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
    def check_prompt(self, n_prompt: int) -> None:
        """Raises PromptTooLongError for a prompt no slot can hold (reads only the fixed slot size)."""
        self.engine.scheduler.check_prompt(n_prompt)

    def submit(self, request: GenerationRequest, sink: EventSink) -> None:
        """Queue a request; raises QueueFullError when --max-queue requests already wait."""
        self.submit_group([request], [sink])

    def submit_group(self, requests: list[GenerationRequest], sinks: list[EventSink]) -> None:
        """Queue a request's n choices together (the prompt is computed once: Engine.submit_group)."""
        scheduler = self.engine.scheduler
        scheduler.check_prompt(len(requests[0].prompt_ids))
        with self._wake:
            if self.crash is not None or self._stopping:
                raise EngineStoppedError("the engine has stopped (see the server's log); restart the server")
            if scheduler.is_queue_full(self._n_arriving + len(requests) - 1):
                raise QueueFullError(f"the queue is full ({scheduler.max_queue} requests waiting)")
            self._n_arriving += len(requests)
            self._inbox.append(_Submit(list(requests), list(sinks)))
            self._wake.notify()

    def cancel(self, request_id: str) -> None:
        self._post(lambda: self.engine.cancel(request_id))

    def cancel_all(self) -> None:
        """Cancel every request, waiting or running (shutdown: nobody will read their replies)."""
        self._post(self.engine.scheduler.cancel_all)

    def slots(self) -> list[SlotView]:
        views = []
        speculator = self.engine.speculator
        for slot in self.engine.scheduler.pool.slots:
            seq = slot.seq  # read once: the engine thread may release it meanwhile
            spec = speculator.slots[slot.id] if speculator else None
            proposed = spec.n_proposed if spec else 0
            views.append(
                SlotView(slot.id, slot.state.value, seq.request_id if seq else None, slot.n_cached,
                         len(seq.output_ids) if seq else 0, slot.n_prompt, slot.n_prompt_reused,
                         spec.k if spec else 0,
                         round(spec.n_accepted / proposed, 4) if spec and proposed else None)
            )
        return views

    @property
    def n_waiting(self) -> int:
        return self._n_arriving + self.engine.scheduler.n_waiting

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
        with self._wake:
            self._n_arriving -= len(command.requests)
        try:
            self.engine.submit_group(command.requests, command.sinks)
        except QueueFullError as exc:  # the queue filled between the check and now
            _fail(command, str(exc))
        except Exception as exc:  # noqa: BLE001
            self._report(exc)
            _fail(command, f"internal error: {exc}")

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
