"""The loaded models of a router: load on demand (one load per model however many requests ask),
requests in flight counted per model, keep-alive expiry, and room made by unloading the least
recently used idle models. Runs on the router's event loop; a model process is its unit."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from runner.router.eviction import Resident, make_room
from runner.config.keep_alive import FOREVER
from runner.router.model_process import LoadFailed
from runner.router.servable import ServableModel

RETRY_AFTER_S = 5


class ModelState(str, Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    FAILED = "failed"  # its process ended on its own (a crash, a lost RPC worker) or its last load failed


class Process(Protocol):
    """What the pool needs of a model process (model_process.ModelProcess, or a test's fake)."""

    @property
    def is_alive(self) -> bool: ...

    @property
    def pid(self) -> int | None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def terminate(self) -> None: ...

    async def set_threads(self, n_threads: int) -> None: ...

    def failure_reason(self) -> str: ...


class PoolError(Exception):
    """A request the pool cannot serve now: the HTTP status, one sentence, and a code."""

    def __init__(self, status: int, message: str, code: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.retry_after_s = status, message, code, retry_after_s


@dataclass
class _Slot:
    """One servable model's place in the pool."""

    model: ServableModel
    default_keep_alive_s: float
    keep_alive_s: float = 0.0  # the last request's, else the default (keep_for)
    process: Process | None = None
    loading: asyncio.Task[None] | None = None
    n_waiting: int = 0
    n_in_flight: int = 0
    n_bytes: int = 0
    planned_bytes: int | None = None  # its memory plan, made at its first load (from the GGUF's header)
    n_loads: int = 0
    last_used_s: float = 0.0
    loaded_at: float = 0.0  # wall clock, for people
    unloading: set[asyncio.Task[None]] = field(default_factory=set)
    failure: str = ""  # why its last load failed (cleared by the next that succeeds)

    def __post_init__(self) -> None:
        self.keep_for(None)

    def keep_for(self, asked_s: float | None) -> None:
        """What the latest request said (None: nothing, the default). A pinned model is never unloaded
        for being idle, whatever the duration: it goes only when a request asks for that (0)."""
        if self.model.is_pinned:
            self.keep_alive_s = 0.0 if asked_s == 0 else FOREVER
        else:
            self.keep_alive_s = self.default_keep_alive_s if asked_s is None else asked_s

    @property
    def state(self) -> ModelState:
        if self.loading is not None:
            return ModelState.LOADING
        if self.process is not None:
            return ModelState.LOADED if self.process.is_alive else ModelState.FAILED
        return ModelState.FAILED if self.failure else ModelState.UNLOADED

    @property
    def why_failed(self) -> str:
        if self.process is not None and not self.process.is_alive:
            return self.process.failure_reason()
        return self.failure


@dataclass(frozen=True)
class ModelStatus:
    """What /v1/models, /models and `runner ps` show of a model."""

    model: ServableModel
    state: ModelState
    n_in_flight: int
    n_bytes: int
    loaded_at: float | None
    expires_in_s: float | None  # None: not loaded, or kept forever
    n_loads: int  # processes started for it so far
    pid: int | None
    failure: str = ""  # state FAILED: why


class ModelPool:
    def __init__(self, models: list[ServableModel], spawn: Callable[[ServableModel], Process],
                 plan_bytes: Callable[[ServableModel], Awaitable[int]], *, keep_alive_s: float,
                 max_models: int = 0, memory_budget_bytes: int | None = None,
                 available_bytes: Callable[[], int] | None = None, max_waiting: int = 64, n_threads: int = 0,
                 clock: Callable[[], float] = time.monotonic, log: Callable[[str], None] = lambda _: None) -> None:
        self.default_keep_alive_s = keep_alive_s  # --keep-alive
        self._slots = {m.name: self._slot(m) for m in models}
        self._ids = {model_id: m.name for m in models for model_id in m.ids}
        self.default = models[0].name if models else None
        self._spawn, self._plan_bytes = spawn, plan_bytes
        self._max_models, self._budget, self._available = max_models, memory_budget_bytes, available_bytes
        self._is_closing = False  # terminate_all was called: a load that fails now was stopped, not broken
        self._max_waiting, self._clock, self._log = max_waiting, clock, log
        self._room_lock = asyncio.Lock()
        self._n_threads = n_threads  # the cores the busy models share (0: each keeps its own)
        self._sharing: set[asyncio.Task[None]] = set()

    # -- what is servable ----------------------------------------------------------------------
    def add(self, model: ServableModel) -> None:
        """One more servable model (pulled while the server runs); its ids must be new."""
        self._slots[model.name] = self._slot(model)
        self._ids.update({model_id: model.name for model_id in model.ids})

    def _slot(self, model: ServableModel) -> _Slot:
        return _Slot(model, model.keep_alive_s if model.keep_alive_s is not None else self.default_keep_alive_s)

    def ids(self) -> list[str]:
        return list(self._ids)

    def name_of(self, model_id: str) -> str | None:
        return self._ids.get(model_id)

    def statuses(self) -> list[ModelStatus]:
        now = self._clock()
        return [ModelStatus(s.model, s.state, s.n_in_flight, s.n_bytes,
                            s.loaded_at if s.state is ModelState.LOADED else None,
                            self._expires_in(s, now), s.n_loads,
                            s.process.pid if s.process is not None and s.process.is_alive else None,
                            s.why_failed if s.state is ModelState.FAILED else "")
                for s in self._slots.values()]

    def _expires_in(self, slot: _Slot, now: float) -> float | None:
        if slot.state is not ModelState.LOADED or slot.keep_alive_s == FOREVER:
            return None
        if slot.n_in_flight:
            return slot.keep_alive_s
        return max(0.0, slot.last_used_s + slot.keep_alive_s - now)

    def is_loaded(self, name: str) -> bool:
        return self._slots[name].state is ModelState.LOADED

    def set_keep_alive(self, name: str, keep_alive_s: float) -> None:
        """A keep_alive said without a request to run (Ollama's empty one), the latest said winning as
        a request's does: 0 unloads an idle model now, and a loading or busy one once its load and
        requests have ended (release, expire)."""
        slot = self._slots[name]
        if slot.state not in (ModelState.LOADED, ModelState.LOADING):
            return  # (not loaded nor loading: nothing to unload, and a later load keeps its own)
        slot.keep_for(keep_alive_s)
        if slot.keep_alive_s == 0 and slot.state is ModelState.LOADED and slot.n_in_flight == 0:
            self._unload_soon(slot)

    def loaded(self) -> list[tuple[str, Process]]:
        return [(name, s.process) for name, s in self._slots.items()
                if s.process is not None and s.state is ModelState.LOADED]

    # -- a request's life ------------------------------------------------------------------------
    async def acquire(self, name: str, keep_alive_s: float | None = None) -> Process:
        """The model's process, loaded if need be, with this request counted in flight until release();
        the model stays loaded keep_alive_s after (None: its default), as the latest request says."""
        slot = self._slots[name]
        slot.keep_for(keep_alive_s)
        await self._loaded(slot)
        slot.n_in_flight += 1
        slot.last_used_s = self._clock()
        assert slot.process is not None
        if slot.n_in_flight == 1:
            await self._share_threads()  # before its first step: two busy models must not oversubscribe
        return slot.process

    async def _loaded(self, slot: _Slot) -> None:
        """Once the model is loaded: by this call, or by the load another request started."""
        name = slot.model.name
        while slot.state is not ModelState.LOADED:
            if slot.loading is None:
                slot.loading = asyncio.create_task(self._load(slot))
            if slot.n_waiting >= self._max_waiting:
                raise PoolError(503, f"'{name}' is loading and {slot.n_waiting} requests already wait for it",
                                "model_loading", RETRY_AFTER_S)
            slot.n_waiting += 1
            try:
                await asyncio.shield(slot.loading)
            finally:
                slot.n_waiting -= 1

    def release(self, name: str) -> None:
        slot = self._slots[name]
        slot.n_in_flight -= 1
        slot.last_used_s = self._clock()
        if slot.n_in_flight == 0:
            if slot.keep_alive_s == 0:
                self._unload_soon(slot)
            task = asyncio.create_task(self._share_threads())  # the others may take its cores
            self._sharing.add(task)
            task.add_done_callback(self._sharing.discard)

    async def load(self, name: str) -> None:
        """Load without a request (POST /models/load), to stay its default keep-alive."""
        self._slots[name].keep_for(None)
        await self._loaded(self._slots[name])
        self._slots[name].last_used_s = self._clock()

    async def unload(self, name: str) -> bool:
        """Unload now (POST /models/unload); False if it was not loaded; PoolError while it answers requests."""
        slot = self._slots[name]
        if slot.loading is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(slot.loading)
        if slot.n_in_flight:  # (asked after the load: the requests that waited for it are in flight now)
            raise PoolError(409, f"'{name}' is answering {slot.n_in_flight} requests; unload it when they end "
                                 "(or send keep_alive: 0 with the last)", "model_busy")
        was_loaded = slot.process is not None
        slot.failure = ""  # asked to unload: no longer failed, just unloaded
        await self._unload(slot, "asked to")
        return was_loaded

    async def expire(self) -> list[str]:
        """Unload the idle models whose keep-alive has run out; their names."""
        now = self._clock()
        due = [s for s in self._slots.values() if s.state is ModelState.LOADED and s.n_in_flight == 0
               and now - s.last_used_s >= s.keep_alive_s]
        await self._unload_all(due, "idle past its keep-alive")
        return [s.model.name for s in due]

    def terminate_all(self) -> None:
        """Signal every model process to stop (a shutdown; close() then waits for them)."""
        self._is_closing = True
        for slot in self._slots.values():
            if slot.process is not None:
                slot.process.terminate()

    async def close(self) -> None:
        for slot in self._slots.values():
            if slot.loading is not None:
                slot.loading.cancel()
                with contextlib.suppress(BaseException):
                    await slot.loading
            await self._unload(slot)

    def thread_shares(self) -> dict[str, int]:
        """Each loaded model's decode threads: the cores split evenly between the busy models (at
        least one each); an idle one keeps them all for when it is alone again."""
        loaded = [s for s in self._slots.values() if s.state is ModelState.LOADED]
        n_busy = sum(1 for s in loaded if s.n_in_flight)
        share = max(1, self._n_threads // max(1, n_busy))
        return {s.model.name: share if s.n_in_flight else self._n_threads for s in loaded}

    async def _share_threads(self) -> None:
        if self._n_threads:
            await asyncio.gather(*(self._slots[name].process.set_threads(n)  # type: ignore[union-attr]
                                   for name, n in self.thread_shares().items()))

    # -- loading and unloading -----------------------------------------------------------------
    async def _load(self, slot: _Slot) -> None:
        started_s = self._clock()
        try:
            if slot.process is not None:  # it died (a crash): its remains go first
                await self._unload(slot, "its process had ended")
            try:
                if slot.planned_bytes is None:
                    slot.planned_bytes = await self._plan_bytes(slot.model)
                need = slot.planned_bytes
            except Exception as exc:  # RunnerError: missing file, not GGUF, unknown name, pull failed
                slot.failure = f"cannot load: {exc}"
                raise PoolError(500, f"'{slot.model.name}' cannot load: {exc}", "model_load_failed") from None
            async with self._room_lock:
                await self._make_room(slot, need)
                slot.n_bytes = need
                process = self._spawn(slot.model)
                slot.process = process
                slot.n_loads += 1
            try:
                await process.start()
            except LoadFailed as exc:
                slot.process = None
                if self._is_closing:  # (stopped by the shutdown: not a failure of the model's)
                    raise PoolError(503, "the server is shutting down", "shutting_down") from None
                slot.failure = str(exc)
                if exc.unavailable:  # what it needs is not there now (an RPC worker): worth a retry later
                    raise PoolError(503, f"'{slot.model.name}' is unavailable: {exc}", "model_unavailable",
                                    RETRY_AFTER_S) from None
                raise PoolError(500, f"'{slot.model.name}' failed to load: {exc}", "model_load_failed") from None
            slot.failure = ""
            slot.loaded_at = time.time()
            slot.last_used_s = self._clock()
            self._log(f"runner: loaded {slot.model.name} in {self._clock() - started_s:.1f} s "
                      f"({need / (1 << 20):,.0f} MiB planned)")
        finally:
            slot.loading = None

    async def _make_room(self, slot: _Slot, need: int) -> None:
        residents = [Resident(s.model.name, s.n_bytes, s.n_in_flight + (s.loading is not None and s is not slot),
                              s.model.is_pinned, s.last_used_s)
                     for s in self._slots.values() if s is not slot and s.process is not None]
        if self._budget is not None:
            free = self._budget - sum(r.n_bytes for r in residents)
        else:
            free = self._available() if self._available else 1 << 62
        room = make_room(slot.model.name, need, free, residents, self._max_models)
        if not room.can_load:
            assert room.reason is not None
            raise PoolError(503 if room.is_transient else 500, room.reason,
                            "model_busy" if room.is_transient else "insufficient_memory",
                            RETRY_AFTER_S if room.is_transient else None)
        await self._unload_all([self._slots[name] for name in room.evict], f"to make room for {slot.model.name}")

    def _unload_soon(self, slot: _Slot) -> None:
        async def unload_if_still_idle() -> None:
            if slot.n_in_flight == 0 and slot.loading is None:
                await self._unload(slot, "keep_alive 0")

        task = asyncio.create_task(unload_if_still_idle())
        slot.unloading.add(task)
        task.add_done_callback(slot.unloading.discard)

    async def _unload(self, slot: _Slot, why: str = "") -> None:
        await self._unload_all([slot], why)

    async def _unload_all(self, slots: list[_Slot], why: str = "") -> None:
        """Unload these models: every one is taken out of service before the first is awaited, so no
        request acquires one of them while another stops (and then loses it mid-reply)."""
        processes = []
        for slot in slots:
            processes.append(slot.process)
            slot.process, slot.n_bytes = None, 0
        for slot, process in zip(slots, processes, strict=True):
            if process is not None:
                await process.stop()
                if why:
                    self._log(f"runner: unloaded {slot.model.name} ({why})")
