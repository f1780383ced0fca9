"""The route table and its handlers: each handler parses its dialect's body, hands the parameters
to the chat pipeline, picks the dialect's reply builder and lets streaming.run answer."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import jinja2
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from runner.server import anthropic_messages, ollama_routes, openai_responses
from runner.server.chat_pipeline import (
    chat_request,
    completion_request,
    count_chat_tokens,
    embed,
    embedding_ids,
    reasoning_splitter,
)
from runner.server.edge import api_body, check_auth
from runner.server.errors import ApiError, invalid
from runner.server.guards import PAGE_HEADERS
from runner.server.metrics import render_metrics
from runner.server.openai_chat_replies import (
    ChatReplyBuilder,
    ChoicesBuilder,
    CompletionReplyBuilder,
)
from runner.server.openai_params import parse_chat, parse_completion, parse_embeddings
from runner.server.openapi import openapi_document
from runner.server.request_fields import check_model, ignored_tools_header
from runner.server.state import ServerState
from runner.server.streaming import ReplyBuilder, run

WEBUI_DIR = Path(__file__).resolve().parents[1] / "webui"
Handler = Callable[[ServerState, Request], Awaitable[Response]]
S = TypeVar("S")


# -- generation -------------------------------------------------------------------------------
async def chat_completions(state: ServerState, request: Request) -> Response:
    params = parse_chat(await api_body(state, request))
    check_model(params.common.model, state.model_ids)
    chat = await chat_request(state, params, "chatcmpl")
    model = chat.common.model or state.served_name
    builders = [ChatReplyBuilder(chat.gen.request_id, model, state.facts.token_bytes,
                                 chat.common.n_top_logprobs is not None, reasoning_splitter(state, chat.gen.prompt_ids),
                                 chat.reading, index=i)
                for i in range(len(chat.gens))]
    builder: ReplyBuilder = builders[0]
    if len(builders) > 1:
        builder = ChoicesBuilder(builders, [g.request_id for g in chat.gens], len(builders))
    return await run(state, request, [chat.gens], builder, chat.common.stream, chat.common.include_usage)


async def completions(state: ServerState, request: Request) -> Response:
    params = parse_completion(await api_body(state, request))
    check_model(params.common.model, state.model_ids)
    completion = await completion_request(state, params)
    common, gens = completion.common, completion.gens
    model = common.model or state.served_name
    echoes = [echo for group, echo in zip(completion.groups, completion.echoes, strict=True) for _ in group]
    builders = [CompletionReplyBuilder(gens[0].request_id, model, state.facts.token_bytes,
                                       common.n_top_logprobs is not None, index=i, echo=echo,
                                       prompt_token_bytes=state.facts.prompt_token_bytes)
                for i, echo in enumerate(echoes)]
    builder: ReplyBuilder = builders[0]
    if len(builders) > 1:
        builder = ChoicesBuilder(builders, [g.request_id for g in gens], common.n, group_size=params.best_of)
    return await run(state, request, completion.groups, builder, common.stream, common.include_usage)


async def responses(state: ServerState, request: Request) -> Response:
    body = await api_body(state, request)
    params = openai_responses.parse_request(body)
    check_model(params.common.model, state.model_ids)
    chat = await chat_request(state, params, "resp")
    builder = openai_responses.ResponsesBuilder(
        chat.gen.request_id, chat.common.model or state.served_name, len(chat.gen.prompt_ids),
        openai_responses.echoed(body, params), reasoning_splitter(state, chat.gen.prompt_ids), chat.reading)
    return await run(state, request, [chat.gens], builder, chat.common.stream,
                     headers=ignored_tools_header(params.ignored_tools))


async def messages(state: ServerState, request: Request) -> Response:
    try:
        params = anthropic_messages.parse_messages(await api_body(state, request, anthropic_messages.api_key(request)))
        check_model(params.common.model, state.model_ids)
        chat = await chat_request(state, params, "msg")
        builder = anthropic_messages.MessageBuilder(
            chat.gen.request_id, chat.common.model or state.served_name, len(chat.gen.prompt_ids), chat.common.stop,
            reasoning_splitter(state, chat.gen.prompt_ids), chat.reading, params.show_thinking,
            window_bound=chat.gen.max_tokens < (chat.common.max_tokens or 0))
        return await run(state, request, [chat.gens], builder, chat.common.stream,
                         headers=ignored_tools_header(params.ignored_tools))
    except ApiError as exc:
        return anthropic_messages.error_response(exc)


async def count_tokens(state: ServerState, request: Request) -> Response:
    try:
        body = await api_body(state, request, anthropic_messages.api_key(request))
        params = anthropic_messages.parse_messages(body, counting=True)
        check_model(params.common.model, state.model_ids)
        return JSONResponse({"input_tokens": await count_chat_tokens(state, params, "msg")})
    except ApiError as exc:
        return anthropic_messages.error_response(exc)


async def embeddings(state: ServerState, request: Request) -> Response:
    params = parse_embeddings(await api_body(state, request))
    check_model(params.model, state.model_ids)
    facts = state.facts
    if params.dimensions is not None and params.dimensions != facts.n_embd:
        raise invalid(f"'dimensions' must be this model's own, {facts.n_embd} (vectors are not "
                      "shortened here)", "dimensions")
    if isinstance(params.inputs[0], str):
        ids = await embedding_ids(state, params.inputs)
    else:
        ids = [list(x) for x in params.inputs]
        if any(t >= facts.n_vocab for x in ids for t in x):
            raise invalid(f"token ids must be in [0, {facts.n_vocab})", "input")
    vectors = await embed(state, ids)
    data = [{"object": "embedding", "index": i,
             "embedding": (base64.b64encode(v.astype("<f4").tobytes()).decode() if params.encoding_format == "base64"
                           else v.tolist())} for i, v in enumerate(vectors)]
    n_tokens = sum(len(x) for x in ids)
    return JSONResponse({"object": "list", "data": data, "model": params.model or state.served_name,
                         "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})


# -- about the server ---------------------------------------------------------------------------
async def models(state: ServerState, request: Request) -> Response:
    check_auth(state, request)
    return JSONResponse({"object": "list", "data": _model_entries(state)})


async def model(state: ServerState, request: Request) -> Response:
    """GET /v1/models/{model}: one of the list (OpenAI's models.retrieve)."""
    check_auth(state, request)
    return JSONResponse(one_model(_model_entries(state), request.path_params["model"]))


def _model_entries(state: ServerState) -> list[dict[str, Any]]:
    return [{"id": m, "object": "model", "created": state.created, "owned_by": "runner",
             "placement": state.facts.placement, "inputs": list(state.facts.inputs)} for m in state.model_ids]


def one_model(entries: list[dict[str, Any]], model_id: str) -> dict[str, Any]:
    """The entry with this id; 404 model_not_found naming the served ones."""
    served_id = check_model(model_id, [e["id"] for e in entries])  # (NAME:latest is NAME)
    return next(e for e in entries if e["id"] == served_id)


async def openapi(state: ServerState, request: Request) -> Response:
    return JSONResponse(openapi_document(needs_key=state.api_key is not None, max_n=state.facts.n_slots,
                                         model_ids=state.model_ids))


async def health(state: ServerState, request: Request) -> Response:
    if not state.engine_thread.is_alive:
        return JSONResponse({"status": "error", "error": "the engine thread has stopped"}, status_code=503)
    return JSONResponse({"status": "ok", "model": state.served_name, "slot_context": state.facts.ctx_size})


async def slots(state: ServerState, request: Request) -> Response:
    check_auth(state, request)
    snapshot = await run_in_threadpool(state.engine_thread.snapshot)
    return JSONResponse([dataclasses.asdict(s) for s in snapshot.slots])


async def metrics(state: ServerState, request: Request) -> Response:
    check_auth(state, request)
    snapshot = await run_in_threadpool(state.engine_thread.snapshot)
    return PlainTextResponse(render_metrics(snapshot), media_type="text/plain; version=0.0.4")


async def set_threads(state: ServerState, request: Request) -> Response:
    """A router shares the cores between its busy models: this model's decode threads from now on."""
    body = await api_body(state, request)
    n_threads = body.get("threads")
    if type(n_threads) is not int or n_threads < 1:
        raise invalid("'threads' must be a whole number of 1 or more", "threads")
    await run_in_threadpool(state.engine_thread.call, lambda: state.loaded.set_threads(n_threads))
    return JSONResponse({"threads": n_threads})


_PAGE = jinja2.Environment(loader=jinja2.FileSystemLoader(str(WEBUI_DIR)), autoescape=True)


async def index(state: ServerState, request: Request) -> Response:
    if on_port(request, state.ollama_port):
        return ollama_is_running()
    return index_page(state.served_name, state.api_key is not None)


def ollama_is_running() -> Response:
    """What Ollama answers at its root: apps look for it to find a server."""
    return PlainTextResponse("Ollama is running")


def on_port(request: Request, port: int | None) -> bool:
    """Whether the request came in on this port (of this server's own sockets)."""
    server = request.scope.get("server")
    return port is not None and server is not None and server[1] == port


def index_page(model: str, needs_key: bool) -> HTMLResponse:
    """The web chat's page, opening on `model`."""
    html = _PAGE.get_template("index.html").render(model=model, needs_key=needs_key)
    return HTMLResponse(html, headers={"Cache-Control": "no-cache", **PAGE_HEADERS})


# -- the table ----------------------------------------------------------------------------------
ROUTES: list[tuple[str, str, Handler]] = [
    ("GET", "/", index),
    ("POST", "/v1/chat/completions", chat_completions),
    ("POST", "/v1/completions", completions),
    ("POST", "/v1/embeddings", embeddings),
    ("POST", "/v1/responses", responses),
    ("POST", "/v1/messages", messages),
    ("POST", "/v1/messages/count_tokens", count_tokens),
    ("GET", "/v1/models", models),
    ("GET", "/v1/models/{model:path}", model),
    ("GET", "/health", health),
    ("GET", "/openapi.json", openapi),
    ("GET", "/slots", slots),
    ("GET", "/metrics", metrics),
    *ollama_routes.ROUTES,
]


MODEL_PROCESS_ROUTES: list[tuple[str, str, Handler]] = [("POST", "/model-process/threads", set_threads)]


def routes(state: ServerState) -> list[BaseRoute]:
    """The table's handlers bound to this server's state, and the web chat's static files."""
    return route_table(ROUTES + (MODEL_PROCESS_ROUTES if state.is_model_process else []), state)


def route_table(rows: list[tuple[str, str, Callable[[S, Request], Awaitable[Response]]]], state: S) -> list[BaseRoute]:
    """Routes for (method, path, handler) rows, each handler given `state`, and the web chat's files."""
    table: list[BaseRoute] = [Route(path, _bound(handler, state), methods=[method]) for method, path, handler in rows]
    table.insert(1, Mount("/webui", app=StaticFiles(directory=str(WEBUI_DIR)), name="webui"))
    return table


def _bound(handler: Callable[[S, Request], Awaitable[Response]], state: S) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        return await handler(state, request)

    endpoint.__name__ = handler.__name__
    return endpoint
