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

from runner.server import anthropic_messages, ollama_api
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
    middleware = [Middleware(RequestGuard, hosts=hosts, cors_origins=cors_origins, refusal=enveloped)]
    if cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=sorted(cors_origins), allow_methods=["*"],
                                     allow_headers=["*"], max_age=600))
    return Starlette(routes=table, exception_handlers=handlers, lifespan=lifespan, middleware=middleware)


def enveloped(path: str, exc: ApiError) -> Response:
    """The error in the envelope of the dialect whose path it is: Anthropic's, Ollama's, else OpenAI's."""
    if path.startswith("/v1/messages"):
        return anthropic_messages.error_response(exc)
    if path.startswith("/api/"):
        return ollama_api.error_response(exc)
    return exc.response()


async def api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return enveloped(request.url.path, exc)


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return enveloped(request.url.path, ApiError(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}",
                                                code=code))


async def server_error(request: Request, exc: Exception) -> Response:
    return enveloped(request.url.path, ApiError(500, f"internal error: {type(exc).__name__}", "server_error"))
