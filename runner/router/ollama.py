"""Ollama's model routes on a router: every servable model whose file is here (/api/tags), one
described without loading it (/api/show), the loaded ones (/api/ps). Chat, generate and embed go
to the model's process like every API request (router/routes.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from runner.catalog.store import ModelStore, shares_a_file
from runner.core.errors import RunnerError
from runner.router.model_pool import ModelState, PoolError
from runner.router.servable import ServableModel, name_of
from runner.router.state import RouterState
from runner.server import ollama_models, ollama_pulls, ollama_routes
from runner.server.edge import check_key
from runner.server.errors import ApiError
from runner.server.guards import read_body
from runner.server.request_fields import check_model, parse_json

Handler = Callable[[RouterState, Request], Awaitable[Response]]


async def version(state: RouterState, request: Request) -> Response:
    return JSONResponse({"version": ollama_models.OLLAMA_VERSION})


@ollama_routes.ollama_errors
async def tags(state: RouterState, request: Request) -> Response:
    check_key(state.api_key, request)
    listed = []
    for status in state.pool.statuses():
        info = state.describe(status.model)
        if info is not None:  # (a catalog model not pulled yet is not listed, as Ollama lists what is local)
            listed += [ollama_models.tag(model_id, info) for model_id in status.model.ids]
    return JSONResponse({"models": listed})


@ollama_routes.ollama_errors
async def ps(state: RouterState, request: Request) -> Response:
    check_key(state.api_key, request)
    running = []
    for s in state.pool.statuses():
        info = state.describe(s.model) if s.state is ModelState.LOADED else None
        if info is not None:
            expires_at = None if s.expires_in_s is None else time.time() + s.expires_in_s
            running.append(ollama_models.running(s.model.name, info, s.n_bytes, expires_at, s.model.options.ctx_size))
    return JSONResponse({"models": running})


@ollama_routes.ollama_errors
async def show(state: RouterState, request: Request) -> Response:
    check_key(state.api_key, request)
    body = parse_json(await read_body(request, state.max_body_bytes))
    requested = ollama_routes.request_model(body, older_name="name")
    name = state.pool.name_of(check_model(requested, state.pool.ids()))
    status = next(s for s in state.pool.statuses() if s.model.name == name)
    info = state.describe(status.model)
    if info is None and status.failure:
        raise ApiError(500, f"model '{requested}' cannot be read: {status.failure}", "server_error",
                       code="model_load_failed")
    if info is None:
        raise ApiError(404, f"model '{requested}' has no readable file here yet: a first request for it pulls it "
                            "(or says what is wrong with its file)", code="not_found")
    return JSONResponse(ollama_models.show(info))


@ollama_routes.ollama_errors
async def pull(state: RouterState, request: Request) -> Response:
    """/api/pull: into the cache, and servable from then on."""
    check_key(state.api_key, request)
    body = _body(await read_body(request, state.max_body_bytes))
    assert state.store is not None
    store = state.store

    def servable(name: str) -> None:
        if state.pool.name_of(name) is None:
            state.pool.add(ServableModel(name_of(name, store.catalog), name, state.options))

    return await ollama_pulls.pull_response(store, body, servable)


@ollama_routes.ollama_errors
async def delete(state: RouterState, request: Request) -> Response:
    """/api/delete: unloaded first (409 while it answers requests), then its files removed."""
    check_key(state.api_key, request)
    name = ollama_pulls.model_named(_body(await read_body(request, state.max_body_bytes)))
    store = state.store
    assert store is not None
    files = await asyncio.to_thread(ollama_pulls.files_to_delete, store, name)
    running = [status.model for status in state.pool.statuses()
               if status.state in (ModelState.LOADED, ModelState.LOADING)]
    users = await asyncio.to_thread(lambda: {m.name for m in running if shares_a_file(files, _files_of(store, m))})
    for served in sorted(users | {n for n in [state.pool.name_of(name)] if n is not None}):
        try:
            await state.pool.unload(served)
        except PoolError as exc:
            raise ApiError(exc.status, exc.message, code=exc.code) from None
    await asyncio.to_thread(ollama_pulls.delete, store, name)
    return JSONResponse({})


def _files_of(store: ModelStore, model: ServableModel) -> list[Path]:
    """The cached files a servable model runs on: its first file, its projector, its draft model
    (what of them is cached)."""
    files = []
    try:
        path, ref = store.resolve(model.source, pull_missing=False)
        files.append(path)
        projector = (store.resolve(model.options.mmproj, pull_missing=False)[0] if model.options.mmproj
                     else store.projector_of(model.source))
        files += [projector] if projector is not None else []
        draft = model.options.draft or (ref.entry.draft if ref is not None else "")
        if draft and draft != "ngram":
            files.append(store.resolve(draft, pull_missing=False)[0])
    except RunnerError:
        pass
    return files


def _body(raw: bytes) -> dict:
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object", code="invalid_json")
    return body


ROUTES: list[tuple[str, str, Handler]] = [
    ("GET", "/api/version", version),
    ("GET", "/api/tags", tags),
    ("GET", "/api/ps", ps),
    ("POST", "/api/show", show),
    ("POST", "/api/pull", pull),
    ("DELETE", "/api/delete", delete),
    *ollama_routes.NOT_DONE,
]
