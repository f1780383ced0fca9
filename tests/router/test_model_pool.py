"""The pool's decisions on scripted model processes and an injected clock (the real processes:
test_router.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from runner.config.options import EngineOptions
from runner.router.model_pool import RETRY_AFTER_S, ModelPool, ModelState, PoolError
from runner.router.model_process import LoadFailed
from runner.router.servable import ServableModel

MIB = 1 << 20


class FakeProcess:
    def __init__(self, model: ServableModel, log: list[str], gate: asyncio.Event | None, failure: str | None) -> None:
        self.model, self._log, self._gate, self._failure = model, log, gate, failure
        self._alive = False

    @property
    def is_alive(self) -> bool:
        return self._alive

    @property
    def pid(self) -> int | None:
        return 1 if self._alive else None

    async def start(self) -> None:
        self._log.append(f"start {self.model.name}")
        if self._gate is not None:
            await self._gate.wait()
        if self._failure:
            raise LoadFailed(self._failure, unavailable="worker" in self._failure)
        self._alive = True

    stop_gate: asyncio.Event | None = None  # a stop that takes a while

    async def stop(self) -> None:
        if self.stop_gate is not None:
            await self.stop_gate.wait()
        if self._alive:
            self._log.append(f"stop {self.model.name}")
        self._alive = False

    def terminate(self) -> None:
        self._alive = False

    async def set_threads(self, n_threads: int) -> None:
        if n_threads != getattr(self, "n_threads", None):
            self.n_threads = n_threads
            self._log.append(f"threads {self.model.name} {n_threads}")

    def crash(self) -> None:
        self._alive = False

    def failure_reason(self) -> str:
        return f"the model process for '{self.model.name}' ended (signal SIGABRT)"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def model(name: str, *, pinned: bool = False, keep_alive_s: float | None = None) -> ServableModel:
    return ServableModel(name, name, EngineOptions(), is_pinned=pinned, keep_alive_s=keep_alive_s)


def make_pool(names: list[str] | list[ServableModel], log: list[str], *, sizes: dict[str, int] | None = None,
              gate: asyncio.Event | None = None, failures: dict[str, str] | None = None,
              clock: Clock | None = None, **kw: object) -> tuple[ModelPool, dict[str, FakeProcess]]:
    processes: dict[str, FakeProcess] = {}
    models = [model(n) if isinstance(n, str) else n for n in names]

    def spawn(m: ServableModel) -> FakeProcess:
        processes[m.name] = FakeProcess(m, log, gate, (failures or {}).get(m.name))
        return processes[m.name]

    async def plan(m: ServableModel) -> int:
        if m.name == "missing":
            raise FileNotFoundError("model file not found: missing.gguf")
        return (sizes or {}).get(m.name, 100) * MIB

    kw.setdefault("keep_alive_s", 1800.0)
    pool = ModelPool(models, spawn, plan, clock=clock or Clock(), **kw)  # type: ignore[arg-type]
    return pool, processes


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())


def test_eight_requests_arriving_together_cause_one_load() -> None:
    log: list[str] = []

    async def test() -> None:
        gate = asyncio.Event()
        pool, _ = make_pool(["a"], log, gate=gate)
        waiters = [asyncio.create_task(pool.acquire("a")) for _ in range(8)]
        await asyncio.sleep(0)
        assert [s.state for s in pool.statuses()] == [ModelState.LOADING]
        gate.set()
        await asyncio.gather(*waiters)
        assert log == ["start a"] and pool.statuses()[0].n_in_flight == 8 and pool.statuses()[0].n_loads == 1

    run(test)


def test_waiting_for_a_load_is_bounded_by_the_queue() -> None:
    async def test() -> None:
        gate = asyncio.Event()
        pool, _ = make_pool(["a"], [], gate=gate, max_waiting=2)
        waiters = [asyncio.create_task(pool.acquire("a")) for _ in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(PoolError) as refused:
            await pool.acquire("a")
        assert (refused.value.status, refused.value.code, refused.value.retry_after_s) == (503, "model_loading", 5)
        gate.set()
        await asyncio.gather(*waiters)

    run(test)


def test_a_failed_load_answers_every_waiter_and_the_next_request_tries_again() -> None:
    log: list[str] = []

    async def test() -> None:
        pool, _ = make_pool(["a"], log, failures={"a": "llama.cpp could not load a.gguf"})
        results = await asyncio.gather(*(pool.acquire("a") for _ in range(3)), return_exceptions=True)
        assert {(e.status, e.message) for e in results if isinstance(e, PoolError)} == {
            (500, "'a' failed to load: llama.cpp could not load a.gguf")}
        assert len(results) == 3 and log == ["start a"]
        with pytest.raises(PoolError):
            await pool.acquire("a")
        assert log == ["start a", "start a"] and pool.statuses()[0].state is ModelState.FAILED

    run(test)


def test_a_model_that_cannot_be_planned_is_refused_before_any_process_starts() -> None:
    log: list[str] = []

    async def test() -> None:
        pool, _ = make_pool(["missing"], log)
        with pytest.raises(PoolError) as refused:
            await pool.acquire("missing")
        assert refused.value.message == "'missing' cannot load: model file not found: missing.gguf"
        assert log == []

    run(test)


def test_keep_alive_expires_on_the_clock_and_a_request_in_flight_holds_the_model() -> None:
    log: list[str] = []
    clock = Clock()

    async def test() -> None:
        pool, _ = make_pool(["a", "b"], log, clock=clock, keep_alive_s=300.0)
        await pool.acquire("a")
        await pool.acquire("b")
        pool.release("b")
        clock.now += 299
        assert await pool.expire() == []
        assert [s.expires_in_s for s in pool.statuses()] == [300.0, 1.0]  # a is busy: its time starts at the end
        clock.now += 1
        assert await pool.expire() == ["b"]
        clock.now += 10_000
        assert await pool.expire() == []  # a is still answering
        pool.release("a")
        clock.now += 300
        assert await pool.expire() == ["a"]
        assert log == ["start a", "start b", "stop b", "stop a"]

    run(test)


def test_a_requests_keep_alive_sets_the_models_and_zero_unloads_after_the_reply() -> None:
    log: list[str] = []
    clock = Clock()

    async def test() -> None:
        pool, _ = make_pool(["a"], log, clock=clock)
        await pool.acquire("a")
        await pool.acquire("a", keep_alive_s=0.0)  # the latest request says; the first is still in flight
        pool.release("a")
        await asyncio.sleep(0)
        assert pool.statuses()[0].state is ModelState.LOADED
        pool.release("a")
        await asyncio.sleep(0.01)
        assert pool.statuses()[0].state is ModelState.UNLOADED and log == ["start a", "stop a"]
        await pool.acquire("a")  # none said: the default again
        assert pool.statuses()[0].expires_in_s == 1800.0

    run(test)


def test_keep_alive_forever_never_expires() -> None:
    clock = Clock()

    async def test() -> None:
        pool, _ = make_pool([model("a", keep_alive_s=float("inf"))], [], clock=clock)
        await pool.load("a")
        clock.now += 1e9
        assert await pool.expire() == [] and pool.statuses()[0].expires_in_s is None

    run(test)


def test_a_pinned_model_outlives_any_keep_alive_and_goes_when_a_request_asks_for_0() -> None:
    """(The idle keep-alive unloaded a pinned model: only eviction kept pins.)"""
    log: list[str] = []
    clock = Clock()

    async def test() -> None:
        pool, _ = make_pool([model("a", pinned=True, keep_alive_s=60.0)], log, clock=clock, keep_alive_s=300.0)
        await pool.acquire("a", keep_alive_s=5.0)
        pool.release("a")
        clock.now += 1e9
        assert await pool.expire() == [] and pool.statuses()[0].expires_in_s is None
        await pool.acquire("a", keep_alive_s=0.0)
        pool.release("a")
        await asyncio.sleep(0.01)
        assert pool.statuses()[0].state is ModelState.UNLOADED and log == ["start a", "stop a"]

    run(test)


def test_keep_alive_0_said_while_a_model_loads_unloads_it_once_loaded_and_its_requests_end() -> None:
    """(Ollama's unload sent while the model loaded was answered "unload" and then left it loaded.)"""
    log: list[str] = []

    async def test() -> None:
        gate = asyncio.Event()
        pool, _ = make_pool(["a", "b"], log, gate=gate)
        loading = asyncio.create_task(pool.load("a"))
        asking = asyncio.create_task(pool.acquire("b"))  # a request that waits for b's load
        await asyncio.sleep(0)
        pool.set_keep_alive("a", 0.0)
        pool.set_keep_alive("b", 0.0)
        gate.set()
        await asyncio.gather(loading, asking)
        assert await pool.expire() == ["a"]  # loaded and idle: its keep-alive has run out
        pool.release("b")  # b's request ends
        await asyncio.sleep(0.01)
        assert [s.state for s in pool.statuses()] == [ModelState.UNLOADED, ModelState.UNLOADED]
        assert log == ["start a", "start b", "stop a", "stop b"]

    run(test)


def test_keep_alive_0_said_to_an_unloaded_model_does_not_outlive_it() -> None:
    """(An Ollama unload of a model not loaded left keep-alive 0 on it: a later POST /models/load,
    pinned or not, was undone a second after.)"""
    log: list[str] = []
    clock = Clock()

    async def test() -> None:
        pool, _ = make_pool([model("a", pinned=True), "b"], log, clock=clock, keep_alive_s=300.0)
        for name in ("a", "b"):
            pool.set_keep_alive(name, 0.0)
            await pool.load(name)
        clock.now += 1
        assert await pool.expire() == []
        assert [s.state for s in pool.statuses()] == [ModelState.LOADED, ModelState.LOADED]

    run(test)


def test_under_a_memory_budget_the_lru_idle_model_goes_and_pinned_and_busy_ones_stay() -> None:
    log: list[str] = []
    clock = Clock()

    async def test() -> None:
        names = [model("pinned", pinned=True), model("old"), model("busy"), model("new")]
        pool, _ = make_pool(names, log, clock=clock, memory_budget_bytes=350 * MIB)
        for name in ("pinned", "old", "busy"):
            await pool.acquire(name)
            clock.now += 1
        pool.release("pinned")
        pool.release("old")
        await pool.acquire("new")
        assert log == ["start pinned", "start old", "start busy", "stop old", "start new"]
        states = {s.model.name: s.state.value for s in pool.statuses()}
        assert states == {"pinned": "loaded", "old": "unloaded", "busy": "loaded", "new": "loaded"}

    run(test)


def test_models_evicted_together_are_out_of_service_before_the_first_stops() -> None:
    """A request for the second victim, arriving while the first stops, must not get a process that
    is then stopped under it (a reply cut short, passed off as whole)."""
    log: list[str] = []

    async def test() -> None:
        pool, processes = make_pool(["a", "b", "big"], log, sizes={"a": 100, "b": 100, "big": 250},
                                    memory_budget_bytes=300 * MIB)
        for name in ("a", "b"):
            await pool.acquire(name)
            pool.release(name)
        first_b = processes["b"]
        slow = processes["a"].stop_gate = asyncio.Event()
        loading = asyncio.create_task(pool.acquire("big"))  # evicts a and b: a's stop takes a while
        await asyncio.sleep(0.01)
        b = asyncio.create_task(pool.acquire("b"))
        await asyncio.sleep(0.01)
        slow.set()
        answers = await asyncio.gather(loading, b, return_exceptions=True)
        assert not first_b.is_alive  # (evicted)
        # each request got a process that is still there, or a clear answer (503: the other holds the room)
        assert all(isinstance(got, PoolError) and got.status == 503 or got.is_alive for got in answers), answers
        assert not all(isinstance(got, PoolError) for got in answers)

    run(test)


def test_a_load_that_only_busy_models_block_is_a_503_and_too_big_a_500_with_the_plan() -> None:
    async def test() -> None:
        pool, _ = make_pool(["busy", "next", "huge"], [], sizes={"huge": 5000}, memory_budget_bytes=150 * MIB)
        await pool.acquire("busy")
        with pytest.raises(PoolError) as busy:
            await pool.acquire("next")
        assert (busy.value.status, busy.value.retry_after_s) == (503, 5)
        with pytest.raises(PoolError) as huge:
            await pool.acquire("huge")
        assert (huge.value.status, huge.value.code) == (500, "insufficient_memory")
        assert huge.value.message == "'huge' needs 5,000 MiB but at most 150 MiB can be freed for it"
        assert {s.model.name: s.state.value for s in pool.statuses()}["busy"] == "loaded"

    run(test)


def test_unloading_a_busy_model_is_refused_and_an_idle_one_goes() -> None:
    log: list[str] = []

    async def test() -> None:
        pool, _ = make_pool(["a"], log)
        await pool.acquire("a")
        with pytest.raises(PoolError) as refused:
            await pool.unload("a")
        assert (refused.value.status, refused.value.code) == (409, "model_busy")
        pool.release("a")
        assert await pool.unload("a") is True and await pool.unload("a") is False
        assert log == ["start a", "stop a"]

    run(test)


def test_a_crashed_process_is_loaded_again_by_the_next_request() -> None:
    log: list[str] = []

    async def test() -> None:
        pool, processes = make_pool(["a"], log)
        await pool.load("a")
        processes["a"].crash()
        status = pool.statuses()[0]
        assert status.state is ModelState.FAILED and status.failure == "the model process for 'a' ended (signal SIGABRT)"
        await pool.acquire("a")
        status = pool.statuses()[0]
        assert log == ["start a", "start a"] and status.state is ModelState.LOADED and status.failure == ""

    run(test)


def test_a_model_whose_rpc_worker_is_down_is_503_and_failed_until_a_load_succeeds() -> None:
    log: list[str] = []
    failures = {"a": "cannot reach RPC worker 127.0.0.1:50052: Connection refused", "b": "not a GGUF"}

    async def test() -> None:
        pool, _ = make_pool(["a", "b"], log, failures=failures)
        with pytest.raises(PoolError) as down:
            await pool.acquire("a")
        assert (down.value.status, down.value.code, down.value.retry_after_s) == (503, "model_unavailable", RETRY_AFTER_S)
        with pytest.raises(PoolError) as broken:
            await pool.acquire("b")
        assert (broken.value.status, broken.value.code) == (500, "model_load_failed")
        assert {s.model.name: (s.state, s.failure) for s in pool.statuses()} == {
            "a": (ModelState.FAILED, failures["a"]), "b": (ModelState.FAILED, "not a GGUF")}
        del failures["a"]  # the worker is back
        await pool.acquire("a")
        assert pool.statuses()[0].state is ModelState.LOADED and pool.statuses()[0].failure == ""

    run(test)


def test_busy_models_share_the_cores_and_one_alone_gets_them_all_back() -> None:
    log: list[str] = []

    async def test() -> None:
        pool, _ = make_pool(["a", "b", "c"], log, n_threads=4)
        await pool.acquire("a")
        assert pool.thread_shares() == {"a": 4} and log == ["start a", "threads a 4"]
        await pool.acquire("b")
        assert log[-2:] == ["threads a 2", "threads b 2"]  # set before b's request goes on
        await pool.load("c")  # loaded, not busy
        assert pool.thread_shares() == {"a": 2, "b": 2, "c": 4}
        pool.release("a")
        await asyncio.sleep(0.01)
        assert pool.thread_shares() == {"a": 4, "b": 4, "c": 4}
        assert log[-3:] == ["threads a 4", "threads b 4", "threads c 4"]

    run(test)


def test_a_load_stopped_by_the_shutdown_is_a_503_not_the_models_failure() -> None:
    log: list[str] = []

    async def test() -> None:
        gate = asyncio.Event()
        pool, processes = make_pool(["a"], log, gate=gate)
        loading = asyncio.create_task(pool.acquire("a"))
        await asyncio.sleep(0.01)
        pool.terminate_all()  # SIGTERM, while the process is starting
        processes["a"]._failure = "the model process for 'a' ended (signal SIGTERM)"
        gate.set()
        with pytest.raises(PoolError) as refused:
            await loading
        assert (refused.value.status, refused.value.code) == (503, "shutting_down")  # (was 500 model_load_failed)
        assert {s.model.name: s.failure for s in pool.statuses()} == {"a": ""}  # (and 'a' was marked failed)

    run(test)
