"""The router's route table: API requests go to the process of the model they name (loaded on
demand); the model list, load/unload, health, slots and metrics are answered here."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute

from runner.core.errors import RunnerError
from runner.runtime.gguf_file import read_gguf
from runner.router import ollama
from runner.router.metrics import labelled
from runner.router.model_pool import ModelState, ModelStatus, PoolError
from runner.router.proxy import forward
from runner.router.servable import ServableModel
from runner.router.state import RouterState
from runner.router.upstream import Upstream, UpstreamError
from runner.server import anthropic_messages, ollama_api, openai_params, openai_responses
from runner.server.edge import check_key
from runner.server.errors import ApiError, invalid
from runner.server.guards import check_json_content_type, read_body
from runner.server.openapi import openapi_document
from runner.server.request_fields import check_model, parse_json
from runner.server.routes import one_model
from runner.server import routes as server_routes
from runner.server.routes import index_page, ollama_is_running, on_port, route_table

Handler = Callable[[RouterState, Request], Awaitable[Response]]
ASK_TIMEOUT_S = 10.0  # /slots and /metrics leave out a model process that does not answer in time


# -- requests for a model ----------------------------------------------------------------------
async def model_request(state: RouterState, request: Request) -> Response:
    """Any API request: checked here, run by the process of the model it names."""
    path = request.url.path
    anthropic, ollama = path.startswith("/v1/messages"), path.startswith("/api/")
    try:
        check_key(state.api_key, request, anthropic_messages.api_key(request) if anthropic else None)
        if not ollama:  # (Ollama's clients send none; the Origin guard covers what the check is for)
            check_json_content_type(request)
        body = await read_body(request, state.max_body_bytes)
        parsed = parse_json(body)
        name = _served_name(state, parsed.get("model") if isinstance(parsed, dict) else None)
        keep_alive = ollama_api.keep_alive(parsed)
        check_params(path, parsed)
        if path in UNLOADING_PATHS and keep_alive == 0 and _is_empty_ollama_request(parsed):  # nothing to run
            state.pool.set_keep_alive(name, keep_alive)
            return JSONResponse(ollama_api.loaded_reply(parsed["model"], True, path == "/api/chat"))
        is_cold = not state.pool.is_loaded(name)
        asked_ns = time.monotonic_ns()
        process = await _acquire(state, name, keep_alive)
        load_ns = time.monotonic_ns() - asked_ns if ollama and is_cold else 0  # (Ollama's load_duration)
        return await forward(process.upstream, request, body, name, lambda: state.pool.release(name), load_ns)
    except ApiError as exc:
        if ollama:
            return ollama_api.error_response(exc)
        return anthropic_messages.error_response(exc) if anthropic else exc.response()


# what the model's process would parse, parsed here first: a request it would refuse loads nothing
# (and unloads nothing to make room). Checks that need the model (its context, slots, vocabulary)
# are left to the process: Ollama's num_ctx is read here against no bound.
BODY_PARSERS: dict[str, Callable[[dict[str, Any]], object]] = {
    "/v1/chat/completions": openai_params.parse_chat,
    "/v1/completions": openai_params.parse_completion,
    "/v1/embeddings": openai_params.parse_embeddings,
    "/v1/responses": openai_responses.parse_request,
    "/v1/messages": anthropic_messages.parse_messages,
    "/v1/messages/count_tokens": lambda body: anthropic_messages.parse_messages(body, counting=True),
    "/api/chat": lambda body: ollama_api.parse_chat(body, sys.maxsize),
    "/api/generate": lambda body: ollama_api.parse_generate(body, sys.maxsize),
}


def check_params(path: str, body: dict[str, Any]) -> None:
    """Raises the ApiError the model's process would answer this body with, where it needs no model."""
    parser = BODY_PARSERS.get(path)
    if parser is not None:
        parser(body)


# where Ollama reads a request with nothing to run and keep_alive 0 as "unload" (an empty embed is
# passed on: its keep_alive 0 unloads after its reply, as any request's does)
UNLOADING_PATHS = ("/api/chat", "/api/generate")


def _is_empty_ollama_request(body: dict) -> bool:
    return not body.get("messages") and not body.get("prompt") and not body.get("suffix")


def _served_name(state: RouterState, requested: object) -> str:
    if requested is not None and not isinstance(requested, str):
        raise invalid("'model' must be a string", "model")
    name = state.pool.name_of(check_model(requested, state.pool.ids()))
    assert name is not None
    return name


async def _acquire(state: RouterState, name: str, keep_alive_s: float | None):  # type: ignore[no-untyped-def]
    try:
        return await state.pool.acquire(name, keep_alive_s)
    except PoolError as exc:
        raise _api_error(exc) from None


def _api_error(exc: PoolError) -> ApiError:
    headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s else None
    kind = "server_error" if exc.status >= 500 else "invalid_request_error"
    return ApiError(exc.status, exc.message, kind, param="model", code=exc.code, headers=headers)


# -- the models --------------------------------------------------------------------------------
def _inputs(state: RouterState, model: ServableModel) -> list[str]:
    """What the model's prompts may hold, told from its projector's header (an image where it cannot
    be read: a catalog or Hub --mmproj not pulled yet; the catalog's word where none is here)."""
    try:
        path = (Path(model.options.mmproj) if model.options.mmproj
                else state.store.projector_of(model.source) if state.store is not None else None)
    except RunnerError:
        return ["text"]
    if path is None:
        return _catalog_inputs(state, model.source)
    try:
        meta = read_gguf(path).metadata
    except (OSError, RunnerError):
        return ["text", "image"]
    return (["text"] + (["image"] if meta.get("clip.has_vision_encoder") else [])
            + (["audio"] if meta.get("clip.has_audio_encoder") else []))


def _catalog_inputs(state: RouterState, source: str) -> list[str]:
    """What the catalog says a model of its takes, where no projector is here to read (not pulled
    yet); text for a model it does not know."""
    if state.store is None or not state.store.catalog.is_name(source):
        return ["text"]
    try:
        return list(state.store.catalog.resolve(source).entry.inputs)
    except RunnerError:  # a variant it does not have: the load says so
        return ["text"]


async def v1_models(state: RouterState, request: Request) -> Response:
    """OpenAI's list, every servable id, each with its state (an extension: status.value)."""
    check_key(state.api_key, request)
    return JSONResponse({"object": "list", "data": _v1_entries(state)})


async def v1_model(state: RouterState, request: Request) -> Response:
    """GET /v1/models/{model}: one of the list (OpenAI's models.retrieve)."""
    check_key(state.api_key, request)
    return JSONResponse(one_model(_v1_entries(state), request.path_params["model"]))


def _v1_entries(state: RouterState) -> list[dict[str, Any]]:
    return [{"id": model_id, "object": "model", "created": state.created, "owned_by": "runner",
             "status": {"value": s.state.value},
             # (told from its options or the projector its Hub repo brought: the loaded model's own
             # /v1/models asks libmtmd)
             "inputs": _inputs(state, s.model)}
            for s in state.pool.statuses() for model_id in s.model.ids]


async def models(state: RouterState, request: Request) -> Response:
    """Every servable model with what `runner ps` shows (llama.cpp's router names: GET /models)."""
    check_key(state.api_key, request)
    return JSONResponse({"object": "list", "data": [_described(s) for s in state.pool.statuses()]})


def _described(s: ModelStatus) -> dict[str, object]:
    return {"id": s.model.name, "object": "model", "aliases": list(s.model.aliases), "source": s.model.source,
            "status": {"value": s.state.value}, "pinned": s.model.is_pinned, "requests_in_flight": s.n_in_flight,
            "memory_bytes": s.n_bytes or None, "loaded_at": s.loaded_at, "expires_in_s": s.expires_in_s,
            "loads": s.n_loads, "pid": s.pid}


async def load(state: RouterState, request: Request) -> Response:
    name = await _named_in_body(state, request)
    try:
        await state.pool.load(name)
    except PoolError as exc:
        raise _api_error(exc) from None
    return JSONResponse({"success": True, "model": name, "status": {"value": "loaded"}})


async def unload(state: RouterState, request: Request) -> Response:
    name = await _named_in_body(state, request)
    try:
        was_loaded = await state.pool.unload(name)
    except PoolError as exc:
        raise _api_error(exc) from None
    return JSONResponse({"success": True, "model": name, "was_loaded": was_loaded, "status": {"value": "unloaded"}})


async def _named_in_body(state: RouterState, request: Request) -> str:
    check_key(state.api_key, request)
    check_json_content_type(request)
    body = parse_json(await read_body(request, state.max_body_bytes))
    return _served_name(state, body.get("model") if isinstance(body, dict) else None)


# -- about the server --------------------------------------------------------------------------
async def health(state: RouterState, request: Request) -> Response:
    statuses = state.pool.statuses()
    loaded = {s.model.name: s.state.value for s in statuses if s.state is not ModelState.UNLOADED}
    failed = {s.model.name: s.failure for s in statuses if s.state is ModelState.FAILED}
    return JSONResponse({"status": "ok", "model": state.pool.default, "slot_context": state.slot_context,
                         "models": loaded, "failed": failed})


async def slots(state: RouterState, request: Request) -> Response:
    """Every loaded model's slots, each naming its model (?model=NAME: that model's alone)."""
    check_key(state.api_key, request)
    wanted = request.query_params.get("model")
    answers = await _ask_loaded(state, "/slots", _served_name(state, wanted) if wanted is not None else None)
    return JSONResponse([{"model": name, **slot} for name, text in answers for slot in json.loads(text)])


async def metrics(state: RouterState, request: Request) -> Response:
    check_key(state.api_key, request)
    return PlainTextResponse(labelled(await _ask_loaded(state, "/metrics"), state.pool.statuses()),
                             media_type="text/plain; version=0.0.4")


async def _ask_loaded(state: RouterState, path: str, only: str | None = None) -> list[tuple[str, str]]:
    """GET path from every loaded model's process (a process that does not answer is left out)."""
    async def ask(name: str, upstream: Upstream) -> tuple[str, str] | None:
        try:
            status, body = await asyncio.wait_for(upstream.get(path), ASK_TIMEOUT_S)
        except (UpstreamError, asyncio.TimeoutError):
            return None
        return (name, body.decode()) if status == 200 else None

    loaded = [(n, p) for n, p in state.pool.loaded() if only is None or n == only]
    answers = await asyncio.gather(*(ask(n, p.upstream) for n, p in loaded))  # type: ignore[attr-defined]
    return [a for a in answers if a is not None]


async def openapi(state: RouterState, request: Request) -> Response:
    return JSONResponse(openapi_document(needs_key=state.api_key is not None, max_n=state.max_n,
                                         model_ids=state.pool.ids()))


async def index(state: RouterState, request: Request) -> Response:
    if on_port(request, state.ollama_port):
        return ollama_is_running()
    return index_page(state.pool.default or "", state.api_key is not None)


# -- the table ---------------------------------------------------------------------------------
# what a model's process answers: its server's POST routes, less those the router answers itself
MODEL_PATHS = [path for method, path, _ in server_routes.ROUTES
               if method == "POST" and path not in {p for _, p, _ in ollama.ROUTES}]
ROUTES: list[tuple[str, str, Handler]] = [
    ("GET", "/", index),
    *(("POST", path, model_request) for path in MODEL_PATHS),
    ("GET", "/v1/models", v1_models),
    ("GET", "/v1/models/{model:path}", v1_model),
    ("GET", "/models", models),
    ("POST", "/models/load", load),
    ("POST", "/models/unload", unload),
    ("GET", "/health", health),
    ("GET", "/openapi.json", openapi),
    ("GET", "/slots", slots),
    ("GET", "/metrics", metrics),
    *ollama.ROUTES,
]


def routes(state: RouterState) -> list[BaseRoute]:
    return route_table(ROUTES, state)
