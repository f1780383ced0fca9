"""The router's HTTP app assembled: its route table, the same guards and error envelopes as a
model's server, and a lifespan that preloads the default model, expires idle ones and unloads all
at the end."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from starlette.applications import Starlette

from runner.router.model_pool import PoolError
from runner.router.routes import routes
from runner.router.state import RouterState
from runner.server.app import assembled

EXPIRY_INTERVAL_S = 1.0


def create_router_app(state: RouterState, log: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
                      on_closed: Callable[[], None] = lambda: None) -> Starlette:
    """on_closed runs once every model process has ended (here, not after uvicorn returns: on SIGTERM
    uvicorn re-raises the signal once it has shut down, and the process ends there)."""
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if state.preload and state.pool.default is not None:
            try:
                await state.pool.load(state.pool.default)
            except PoolError as exc:
                log(f"runner: {exc.message} (the server goes on; a request for it tries again)")
        expiry = asyncio.create_task(_expire_idle(state, log))
        yield
        expiry.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await expiry
        await state.pool.close()
        on_closed()

    return assembled(routes(state), lifespan, state.hosts, state.cors_origins)


async def _expire_idle(state: RouterState, log: Callable[[str], None]) -> None:
    while True:
        await asyncio.sleep(EXPIRY_INTERVAL_S)
        try:
            await state.pool.expire()
        except Exception as exc:  # noqa: BLE001 - the next round tries again; the task must outlive it
            log(f"runner: unloading idle models failed: {exc!r}")
