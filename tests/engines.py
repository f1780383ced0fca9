"""The one place tests build engines: on the scripted fake runtime, or on a real tiny GGUF."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fake_runtime import FakeRuntime
from runner.model.loaded_model import LoadedModel
from runner.config.options import EngineOptions
from runner.scheduler.engine import Engine
from runner.scheduler.speculation_stage import Speculation
from runner.scheduler.request import GenerationRequest, StreamEvent
from runner.scheduler.scheduler import Scheduler


def fake_engine(n_slots: int = 1, n_ctx: int = 256, n_batch: int = 64, max_queue: int = 4,
                speculator: Speculation | None = None, runtime: FakeRuntime | None = None,
                clock: Callable[[], float] | None = None) -> tuple[Engine, FakeRuntime]:
    """An engine on the fake runtime (next token = last + 1); `clock` replaces the wall clock (by
    default one that stands still: no step takes time, so nothing depends on this machine's speed)."""
    rt = runtime or FakeRuntime()
    return Engine(rt, Scheduler(n_slots, n_ctx, n_batch, max_queue, rt), rt, speculator,
                  clock=clock or (lambda: 0.0)), rt


def load_tiny(path: Path, parallel: int = 1, **options: Any) -> LoadedModel:
    """A real engine on a tiny GGUF: small context and batch unless the test says otherwise. Batch
    invariance is on: the tiny model's F32 weights need it for output not to depend on the batch,
    which most engine tests compare."""
    opts = EngineOptions(**{"parallel": parallel, "ctx_size": 256, "batch_size": 128, "threads": 2,
                            "batch_invariant": "on", **options})
    return LoadedModel(path, opts, log=lambda _: None)


def submit_all(engine: Engine, requests: list[GenerationRequest]) -> list[list[StreamEvent]]:
    """Submit every request, step until the engine is idle; each request's events."""
    out: list[list[StreamEvent]] = []
    for request in requests:
        events: list[StreamEvent] = []
        engine.submit(request, events.append)
        out.append(events)
    while engine.has_work:
        engine.step()
    return out


def token_ids(events: list[StreamEvent]) -> list[int]:
    return [t for e in events for t in e.token_ids]


@contextmanager
def in_process_server(loaded: LoadedModel, names: tuple[str, ...] = ("tiny",), **state: Any) -> Iterator[Any]:
    """The HTTP app on this model, in-process (a starlette TestClient); closing it ends the
    lifespan, which closes the model. `state`: ServerState settings (allow_remote_media=True, ...)."""
    from starlette.testclient import TestClient

    from runner.server.app import create_app
    from runner.server.engine_thread import EngineThread
    from runner.server.state import ServerState

    thread = EngineThread(loaded.engine)
    thread.start()
    with TestClient(create_app(ServerState(loaded, thread, list(names), **state)), base_url="http://127.0.0.1") as client:
        yield client
