"""Ollama's routes on a model's server: chat and generate through the one chat pipeline, embed,
and the model as Ollama describes it. Every error in Ollama's envelope."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from runner.catalog.store import ModelStore, shares_a_file
from runner.model.model_facts import ModelFacts
from runner.server import ollama_api, ollama_models, ollama_pulls
from runner.server.chat_pipeline import chat_request, completion_request, embed, embedding_ids, reasoning_splitter
from runner.server.edge import api_body, check_auth
from runner.server.errors import ApiError, invalid
from runner.server.params import ChatParams
from runner.server.request_fields import check_model
from runner.server.state import ServerState
from runner.server.streaming import run

Handler = Callable[[ServerState, Request], Awaitable[Response]]
State = TypeVar("State")  # a model's server's state, or a router's (router/ollama.py)
AnyHandler = Callable[[State, Request], Awaitable[Response]]


def ollama_errors(handler: AnyHandler[State]) -> AnyHandler[State]:
    """The handler's ApiErrors answered in Ollama's envelope."""
    async def answer(state: State, request: Request) -> Response:
        try:
            return await handler(state, request)
        except ApiError as exc:
            return ollama_api.error_response(exc)

    answer.__name__ = handler.__name__
    return answer


@ollama_errors
async def chat(state: ServerState, request: Request) -> Response:
    body = await api_body(state, request, any_content_type=True)
    params = ollama_api.parse_chat(body, state.facts.ctx_size)
    check_model(params.common.model, state.model_ids)
    return await _generate(state, request, params, body, is_chat=True)


@ollama_errors
async def generate(state: ServerState, request: Request) -> Response:
    body = await api_body(state, request, any_content_type=True)
    params = ollama_api.parse_generate(body, state.facts.ctx_size)
    check_model(params.common.model, state.model_ids)
    return await _generate(state, request, params, body, is_chat=False)


async def _generate(state: ServerState, request: Request, params: Any, body: dict[str, Any], is_chat: bool
                    ) -> Response:
    model = params.common.model or state.served_name
    keep_alive = ollama_api.keep_alive(body)  # (checked as a router checks it; this server keeps its model)
    if ollama_api.is_empty(params):  # a load or an unload: this process is loaded while it answers
        return JSONResponse(ollama_api.loaded_reply(model, keep_alive == 0, is_chat))
    if isinstance(params, ChatParams):
        prepared = await chat_request(state, params, "ollama")
        builder = ollama_api.OllamaBuilder(model, len(prepared.gen.prompt_ids), is_chat,
                                           reasoning_splitter(state, prepared.gen.prompt_ids), prepared.reading,
                                           params.show_thinking)
        groups = [prepared.gens]
    else:
        completion = await completion_request(state, params)
        groups = completion.groups
        builder = ollama_api.OllamaBuilder(model, len(groups[0][0].prompt_ids), is_chat)
    return await run(state, request, groups, builder, params.common.stream, media_type=ollama_api.NDJSON)


@ollama_errors
async def embed_route(state: ServerState, request: Request) -> Response:
    """/api/embed: {model, input: text or texts, truncate, dimensions} -> {embeddings}; /api/embeddings
    (older): {prompt} -> {embedding}."""
    started_ns = time.monotonic_ns()
    body = await api_body(state, request, any_content_type=True)
    check_model(request_model(body), state.model_ids)
    if request.url.path == "/api/embeddings":
        return await _older_embedding(state, body)
    # no input: no vectors (what Ollama's clients send to have a model loaded)
    texts = [] if body.get("input") in (None, "", []) else _texts(body, "input")
    n_dimensions = ollama_api.embed_dimensions(body, state.facts.n_embd)
    truncates = ollama_api.TRUNCATE.read(body, True)
    ids = await (_truncated_ids(state, texts) if truncates else embedding_ids(state, texts)) if texts else []
    vectors = [ollama_api.shortened(v, n_dimensions).tolist() for v in await embed(state, ids)] if ids else []
    return JSONResponse({"model": body.get("model"), "embeddings": vectors,
                         "total_duration": time.monotonic_ns() - started_ns, "load_duration": 0,
                         "prompt_eval_count": sum(len(x) for x in ids)})


async def _older_embedding(state: ServerState, body: dict[str, Any]) -> Response:
    text = _texts(body, "prompt")[0]
    if not text:  # (Ollama answers an empty prompt so)
        return JSONResponse({"embedding": []})
    (vector,) = await embed(state, await embedding_ids(state, [text], "prompt"), "prompt")
    return JSONResponse({"embedding": vector.tolist()})


def _texts(body: dict[str, Any], key: str) -> list[str]:
    texts = body.get(key)
    texts = [texts] if isinstance(texts, str) else texts
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise invalid(f"{key} must be a string or a non-empty list of strings", key)
    return texts


async def _truncated_ids(state: ServerState, texts: list[str]) -> list[list[int]]:
    """Each text's tokens, cut to what the embedding context holds (Ollama's truncate)."""
    ids = await embedding_ids(state, [_tokenizable_start(state.facts, t) for t in texts])
    n_ctx = (await run_in_threadpool(state.embedding_thread)).n_ctx
    if all(len(x) <= n_ctx for x in ids):
        return ids
    (special_ids,) = await embedding_ids(state, [""])
    return [ollama_api.truncated_ids(x, n_ctx, special_ids) for x in ids]


def _tokenizable_start(facts: ModelFacts, text: str) -> str:
    """The longest start of text the server tokenizes (ModelFacts.max_text_chars): it still makes
    at least a slot's tokens, and an embedding input keeps no more than that."""
    return text[:facts.max_text_chars]


def request_model(body: dict[str, Any], older_name: str | None = None) -> str | None:
    """The body's model; where Ollama's API once named the field otherwise (/api/show: "name"), that too."""
    model = body.get("model")
    if model is None and older_name is not None:
        model = body.get(older_name)
    if model is not None and not isinstance(model, str):
        raise invalid("model must be a string", "model")
    return model


# -- the model, as Ollama describes it -----------------------------------------------------------
async def version(state: ServerState, request: Request) -> Response:
    return JSONResponse({"version": ollama_models.OLLAMA_VERSION})


@ollama_errors
async def tags(state: ServerState, request: Request) -> Response:
    check_auth(state, request)
    return JSONResponse({"models": [ollama_models.tag(name, state.facts.gguf) for name in state.model_ids]})


@ollama_errors
async def ps(state: ServerState, request: Request) -> Response:
    check_auth(state, request)
    return JSONResponse({"models": [ollama_models.running(state.served_name, state.facts.gguf,
                                                          state.facts.memory_bytes, None, state.facts.ctx_size,
                                                          int(state.facts.placement.get("gpu_bytes", 0)))]})


@ollama_errors
async def show(state: ServerState, request: Request) -> Response:
    body = await api_body(state, request, any_content_type=True)
    check_model(request_model(body, older_name="name"), state.model_ids)
    return JSONResponse(ollama_models.show(state.facts.gguf))


# -- the cache ---------------------------------------------------------------------------------
@ollama_errors
async def pull(state: ServerState, request: Request) -> Response:
    body = await api_body(state, request, any_content_type=True)
    return await ollama_pulls.pull_response(ModelStore(), body, lambda name: None)


@ollama_errors
async def delete(state: ServerState, request: Request) -> Response:
    body = await api_body(state, request, any_content_type=True)
    name = ollama_pulls.model_named(body)
    store = ModelStore()
    if name in state.model_ids or shares_a_file(await run_in_threadpool(ollama_pulls.files_to_delete, store, name),
                                                state.loaded.files):
        raise ApiError(409, f"'{name}' is the model this server runs; stop it first", code="model_in_use")
    await run_in_threadpool(ollama_pulls.delete, store, name)
    return JSONResponse({})


async def not_done(state: object, request: Request) -> Response:
    """Ollama's routes that make models out of others: runner serves GGUF files as they are."""
    return ollama_api.error_response(ApiError(
        501, f"{request.url.path} is not supported here: runner serves GGUF files as they are (fetch one with "
        "/api/pull; give a model another name with --alias or --models-config)", code="not_supported"))


NOT_DONE: list[tuple[str, str, Handler]] = [
    *[("POST", path, not_done) for path in ("/api/copy", "/api/create", "/api/push", "/api/blobs/{digest}")],
    ("HEAD", "/api/blobs/{digest}", not_done),
]

ROUTES: list[tuple[str, str, Handler]] = [
    ("POST", "/api/chat", chat),
    ("POST", "/api/generate", generate),
    ("POST", "/api/embed", embed_route),
    ("POST", "/api/embeddings", embed_route),
    ("POST", "/api/show", show),
    ("GET", "/api/version", version),
    ("GET", "/api/tags", tags),
    ("GET", "/api/ps", ps),
    ("POST", "/api/pull", pull),
    ("DELETE", "/api/delete", delete),
    *NOT_DONE,
]
