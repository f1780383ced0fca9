"""The HTTP server assembled: the route table (server/routes.py), the guard and CORS middleware,
the error envelopes, and the lifespan that warms the model up and frees it at the end."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import Lifespan

from runner.server.errors import ApiError
from runner.server.guards import HostPolicy, RequestGuard
from runner.server.routes import routes
from runner.server.state import ServerState


def create_app(state: ServerState) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # the first request would otherwise wait for these (0.2 s here, more for large vocabularies)
        await run_in_threadpool(state.loaded.warm_up)
        yield
        # NOTE: here, not after uvicorn returns: on SIGTERM uvicorn re-raises the signal once it has shut down
        state.close()

    return assembled(routes(state), lifespan, state.hosts, state.cors_origins)


def assembled(table: list[BaseRoute], lifespan: Lifespan, hosts: HostPolicy, cors_origins: frozenset[str]) -> Starlette:
    """A server's routes behind the guards (Host, Origin; CORS where allowed), with the error envelopes."""
    handlers: dict[Any, Callable] = {ApiError: api_error, HTTPException: http_error, Exception: server_error}
    middleware = [Middleware(RequestGuard, hosts=hosts, cors_origins=cors_origins)]
    if cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=sorted(cors_origins), allow_methods=["*"],
                                     allow_headers=["*"], max_age=600))
    return Starlette(routes=table, exception_handlers=handlers, lifespan=lifespan, middleware=middleware)


async def api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return exc.response()


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return ApiError(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}", code=code).response()


async def server_error(request: Request, exc: Exception) -> Response:
    return ApiError(500, f"internal error: {type(exc).__name__}", "server_error").response()
