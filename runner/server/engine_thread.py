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
from runner.scheduler.scheduler import QueueFullError


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


class EngineThread:
    def __init__(self, engine: Engine, on_error: Callable[[BaseException], None] | None = None) -> None:
        self.engine = engine
        self._inbox: deque[Callable[[], None]] = deque()
        self._n_arriving = 0  # submits in the inbox (cancels there wait for no slot)
        self._wake = threading.Condition()
        self._stopping = False
        self._on_error = on_error
        self._thread = threading.Thread(target=self._run, name="runner-engine", daemon=True)
        self.started_s = time.time()

    def start(self) -> None:
        self._thread.start()

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
        scheduler = self.engine.scheduler
        scheduler.check_prompt(len(request.prompt_ids))
        with self._wake:
            if scheduler.is_queue_full(self._n_arriving):
                raise QueueFullError(f"the queue is full ({scheduler.max_queue} requests waiting)")
            self._n_arriving += 1
            self._inbox.append(lambda: self._submit_now(request, sink))
            self._wake.notify()

    def cancel(self, request_id: str) -> None:
        self._post(lambda: self.engine.cancel(request_id))

    def slots(self) -> list[SlotView]:
        views = []
        speculator = self.engine.speculator
        for slot in self.engine.scheduler.pool.slots:
            seq = slot.seq  # read once: the engine thread may release it meanwhile
            spec = speculator.slots[slot.id] if speculator else None
            proposed = sum(spec.acceptance.proposed) if spec else 0
            views.append(
                SlotView(slot.id, slot.state.value, seq.request_id if seq else None, slot.n_cached,
                         len(seq.output_ids) if seq else 0, slot.n_prompt, slot.n_prompt_reused,
                         spec.k if spec else 0,
                         round(sum(spec.acceptance.accepted) / proposed, 4) if spec and proposed else None)
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

    def _submit_now(self, request: GenerationRequest, sink: EventSink) -> None:
        with self._wake:
            self._n_arriving -= 1
        try:
            self.engine.submit(request, sink)
        except QueueFullError as exc:  # the queue filled between the check and now
            sink(StreamEvent(request.request_id, "", finish_reason=FinishReason.ERROR, error=str(exc)))

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._inbox and not self.engine.has_work and not self._stopping:
                    self._wake.wait()
                if self._stopping:
                    return
                commands = list(self._inbox)
                self._inbox.clear()
            for command in commands:
                command()
            try:
                self.engine.step()
            except Exception as exc:  # noqa: BLE001 - keep serving; the failing step's requests get the error
                if self._on_error:
                    self._on_error(exc)
                self.engine.scheduler.fail_all(f"internal error: {exc}")
