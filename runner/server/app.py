"""The OpenAI-compatible HTTP face: parse, validate, template, tokenize, then hand off to the engine."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hmac
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from runner.chat_template import TemplateError, TemplateLimitError
from runner.constraints import (
    JSON_LAYOUT,
    AnyConstraint,
    Constraint,
    ConstraintError,
    GrammarSpec,
    LazyConstraint,
    ReasoningGate,
)
from runner.tools import HERMES, TRIGGERS, ToolReading, call_grammar, syntax_of
from runner.loaded_model import LoadedModel
from runner.scheduler.request import GenerationRequest, StreamEvent
from runner.scheduler.scheduler import PromptTooLongError, QueueFullError
from runner.runtime.embeddings import InputTooLongError
from runner.server.embedding_thread import EmbeddingThread
from runner.server.engine_thread import EngineStoppedError, EngineThread
from runner.server.errors import ApiError, invalid
from runner.server.event_pump import EventPump
from runner.server.guards import (
    DEFAULT_MAX_BODY_BYTES,
    PAGE_HEADERS,
    HostPolicy,
    RequestGuard,
    check_json_content_type,
    read_body,
)
from runner.server.metrics import render_metrics
from runner.server.openapi import openapi_document
from runner.server import anthropic, openai_responses
from runner.server.protocol import (
    ChatParams,
    CommonParams,
    check_model,
    parse_chat,
    parse_completion,
    parse_embeddings,
    parse_json,
)
from runner.server.reasoning import CLOSE as REASONING_CLOSE
from runner.server.reasoning import OPEN as REASONING_OPEN
from runner.server.reasoning import ReasoningSplitter
from runner.server.responses import ChoicesBuilder, ResponseBuilder

WEBUI_DIR = Path(__file__).resolve().parents[1] / "webui"
RETRY_AFTER_S = 1


@dataclass
class ServerState:
    loaded: LoadedModel
    engine_thread: EngineThread
    model_ids: list[str]
    api_key: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    stream_interval_s: float = 0.0  # see EventPump
    reasoning_format: str = "deepseek"  # reasoning.FORMATS: <think>…</think> as reasoning_content, or inline
    hosts: HostPolicy = field(default_factory=lambda: HostPolicy.for_server("127.0.0.1"))
    cors_origins: frozenset[str] = frozenset()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    is_closed: bool = False
    _pump: EventPump | None = None
    _embeddings: EmbeddingThread | None = None
    _embeddings_lock: threading.Lock = field(default_factory=threading.Lock)

    def embedding_thread(self) -> EmbeddingThread:
        """Made on the first embeddings request (the context costs a slot's KV; most servers never embed)."""
        with self._embeddings_lock:
            if self._embeddings is None:
                self._embeddings = EmbeddingThread(self.loaded.embedder())
            return self._embeddings

    def event_pump(self) -> EventPump:
        if self._pump is None:  # created lazily: it needs the running loop
            self._pump = EventPump(asyncio.get_running_loop(), self.stream_interval_s)
        return self._pump

    def close(self) -> None:
        """Stop the engine thread, then free the model (idempotent: lifespan and CLI both call it)."""
        if not self.is_closed:
            self.is_closed = True
            self.engine_thread.stop()
            with self._embeddings_lock:
                if self._embeddings is not None:
                    self._embeddings.stop()
            self.loaded.close()


async def _api_body(state: ServerState, request: Request, key: str | None = None) -> dict[str, Any]:
    """An API request's JSON body, after its key (given, else the Bearer header), content type and size were checked."""
    if state.is_closed:  # shutting down: the model may already be freed
        raise ApiError(503, "The server is shutting down", "server_error", code="shutting_down")
    _check_auth(state, request, key)
    check_json_content_type(request)
    return parse_json(await read_body(request, state.max_body_bytes))


def _check_auth(state: ServerState, request: Request, given: str | None = None) -> None:
    """The request's key: `given` (another dialect's header, e.g. x-api-key), else the Bearer header."""
    if state.api_key is None:
        return
    key = given
    if key is None:
        scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
        key = bearer if scheme.lower() == "bearer" and bearer else None
    if not key:
        raise ApiError(401, "Missing API key: send 'Authorization: Bearer KEY'", code="invalid_api_key")
    if not hmac.compare_digest(key.strip().encode(), state.api_key.encode()):
        raise ApiError(401, "Incorrect API key provided", code="invalid_api_key")


@dataclass(frozen=True)
class ChatRequest:
    """A chat turn made ready for the engine, whichever dialect asked for it."""

    gens: list[GenerationRequest]  # one per choice (n), each with its own constraint state and seed
    common: CommonParams  # the request's parameters, with the tools' grammar where they need one
    reading: ToolReading | None  # how to read tool calls back from the reply (None: no tools)

    @property
    def gen(self) -> GenerationRequest:
        return self.gens[0]


async def _chat_request(state: ServerState, params: ChatParams, prefix: str,
                        tokenize_only: bool = False) -> ChatRequest:
    """Template and tokenize the messages (with the tools), compile the reply's grammar: the same
    path for every dialect's chat endpoint."""
    loaded = state.loaded
    _check_fits(state, sum(len(m.content) for m in params.messages), _prompt_param(prefix))
    tools = list(params.tools) if params.tool_choice != "none" else []
    try:
        prompt_ids = await run_in_threadpool(loaded.chat_prompt_ids, params.messages, tools or None)
    except TemplateLimitError as exc:  # the model's template, not the request, is at fault
        raise ApiError(500, str(exc), "server_error", code="template_limit") from None
    except TemplateError as exc:
        raise invalid(str(exc), "messages", "invalid_messages") from None
    reading, common = None, params.common
    if tools:
        reading = ToolReading(syntax_of(loaded.template.source) if loaded.template.knows_tools else HERMES,
                              tuple(tools))
        # required or a named function: the reply is a call; auto: a call once the reply starts one
        offered = [t for t in tools if params.tool_choice in ("auto", "required", t.name)]
        grammar = call_grammar(reading.syntax, offered, params.parallel_tool_calls, JSON_LAYOUT)
        common = dataclasses.replace(common, grammar=GrammarSpec("lark", grammar, "tools"))
    if tokenize_only:
        return ChatRequest([GenerationRequest("count", prompt_ids)], common, reading)
    constraints = []
    think_id = loaded.single_token_id(REASONING_OPEN) if state.reasoning_format != "none" else None
    for _ in range(common.n):  # each choice follows the grammar on its own
        constraint = await _constraint(state, common)
        spec = common.grammar
        if tools and params.tool_choice == "auto" and constraint is not None:
            assert spec is not None and reading is not None
            constraint = LazyConstraint(TRIGGERS[reading.syntax], lambda: loaded.compile_constraint(spec),
                                        loaded.model.token_bytes)
        elif constraint is not None and think_id is not None:  # a reasoning model: the grammar after its thinking
            assert spec is not None
            splitter = _reasoning(state, prompt_ids)
            constraint = ReasoningGate(lambda: loaded.compile_constraint(spec), loaded.model.token_bytes, think_id,
                                       REASONING_CLOSE, starts_inside=splitter is not None and splitter.starts_inside)
        constraints.append(constraint)
    gen = _generation_request(state, prefix, prompt_ids, common, loaded.template.stop, constraints[0])
    return ChatRequest(_choices(gen, constraints), common, reading)


def _check_n(state: ServerState, n: int, param: str = "n") -> None:
    parallel = state.loaded.options.parallel
    if n > parallel:
        raise invalid(f"'{param}' is {n}, but this server has {parallel} slots (--parallel {parallel}) and each "
                      f"choice takes one; ask for at most {parallel}", param)


def _choices(gen: GenerationRequest, constraints: list[AnyConstraint | None]) -> list[GenerationRequest]:
    """The request's choices: the first as asked, the others with their own ids, constraints and
    seeds (seed + i: choice i is reproducible)."""
    out = [gen]
    for i, constraint in enumerate(constraints[1:], 1):
        seed = gen.sampling.seed
        sampling = gen.sampling if seed is None else dataclasses.replace(gen.sampling, seed=(seed + i) % 2**64)
        out.append(dataclasses.replace(gen, request_id=f"{gen.request_id}-{i}", sampling=sampling,
                                       constraint=constraint))
    return out


def _prompt_param(prefix: str) -> str:
    """The request parameter that holds the prompt, by the endpoint's id prefix."""
    return {"cmpl": "prompt", "resp": "input"}.get(prefix, "messages")


def _check_fits(state: ServerState, n_chars: int, param: str) -> None:
    try:
        state.loaded.check_text_fits(n_chars)
    except PromptTooLongError as exc:
        raise invalid(str(exc), param, "context_length_exceeded") from None


async def _constraint(state: ServerState, common: CommonParams) -> Constraint | None:
    """The request's grammar, compiled before any token is generated (400 naming the parameter if it cannot be)."""
    if common.grammar is None:
        return None
    try:
        return await run_in_threadpool(state.loaded.compile_constraint, common.grammar)
    except ConstraintError as exc:
        raise invalid(str(exc), common.grammar.param, "invalid_grammar") from None


def _reasoning(state: ServerState, prompt_ids: tuple[int, ...]) -> ReasoningSplitter | None:
    """A splitter for a chat reply's reasoning; it starts inside when the template opened the tag."""
    if state.reasoning_format == "none":
        return None
    prompt_tail = state.loaded.model.detokenize(list(prompt_ids[-4:])).rstrip()
    return ReasoningSplitter(starts_inside=prompt_tail.endswith(REASONING_OPEN))


def _generation_request(
    state: ServerState, prefix: str, prompt_ids: tuple[int, ...], common: CommonParams, extra_stop: tuple[str, ...],
    constraint: AnyConstraint | None = None, prompt_logprobs: int | None = None,
) -> GenerationRequest:
    n_vocab = state.loaded.model.n_vocab
    if any(t < 0 or t >= n_vocab for t in prompt_ids):
        raise invalid(f"prompt token ids must be in [0, {n_vocab})", "prompt")
    if any(t >= n_vocab for t, _ in common.sampling.logit_bias):
        raise invalid(f"'logit_bias' token ids must be in [0, {n_vocab})", "logit_bias")
    try:
        state.engine_thread.check_prompt(len(prompt_ids))
    except PromptTooLongError as exc:
        raise invalid(str(exc), _prompt_param(prefix), "context_length_exceeded") from None
    room = state.loaded.options.ctx_size - len(prompt_ids)
    max_tokens = min(state.loaded.options.max_tokens if common.max_tokens is None else common.max_tokens, room)
    return GenerationRequest(
        request_id=f"{prefix}-{uuid.uuid4().hex[:24]}",
        prompt_ids=prompt_ids,
        sampling=common.sampling,
        max_tokens=max_tokens,
        stop=common.stop + extra_stop,
        n_top_logprobs=common.n_top_logprobs,
        ignore_eos=common.ignore_eos,
        constraint=constraint,
        prompt_logprobs=prompt_logprobs,
        beam=common.beam,
        speculate=common.beam is None,  # beams rank by the model's own logprobs, step by step
    )


async def _run(state: ServerState, request: Request, gens: list[GenerationRequest], builder: Any,
               common: CommonParams) -> Response:
    """Submit the request's generations (one per choice) and answer: a stream, or the whole reply."""
    events: asyncio.Queue[StreamEvent] = asyncio.Queue()
    sink = state.event_pump().sink_for(events)
    try:
        state.engine_thread.submit_group(gens, [sink] * len(gens))
    except QueueFullError as exc:
        raise ApiError(503, f"The server is busy: {exc}; retry shortly", "server_error", code="queue_full",
                       headers={"Retry-After": str(RETRY_AFTER_S)}) from None
    except EngineStoppedError as exc:
        raise ApiError(503, str(exc), "server_error", code="engine_stopped") from None
    ids = [gen.request_id for gen in gens]
    if common.stream:
        return StreamingResponse(_stream(state, ids, events, builder, common.include_usage),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    return await _collect(state, request, ids, events, builder)


def _cancel(state: ServerState, request_ids: list[str]) -> None:
    for request_id in request_ids:
        state.engine_thread.cancel(request_id)


async def _stream(state: ServerState, request_ids: list[str], events: asyncio.Queue[StreamEvent], builder: Any,
                  include_usage: bool) -> AsyncIterator[str]:
    finished = False
    n_running = len(request_ids)
    try:
        first = builder.stream_start()
        if first:
            yield first
        while not finished:
            ready = [await events.get()]
            while not events.empty():  # what arrived together leaves in one write
                ready.append(events.get_nowait())
            out = []
            for event in ready:
                n_running -= event.is_final
                finished = n_running == 0
                if event.error is not None:  # the stream ends with the error event
                    yield "".join(out) + builder.stream_error(event.error)
                    return
                chunk = builder.chunk_sse(event)
                if chunk is not None:
                    out.append(chunk)
            if out:
                yield "".join(out)
        yield builder.stream_end(include_usage)
    finally:
        if not finished:  # the client went away (or a choice failed): free the slots
            _cancel(state, request_ids)


async def _wait_for_disconnect(request: Request) -> None:
    """Returns once the client has gone (the body was read, so the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _collect(state: ServerState, request: Request, request_ids: list[str], events: asyncio.Queue[StreamEvent],
                   builder: Any) -> Response:
    """A whole (non-streamed) reply; a client that leaves meanwhile cancels its request at once."""
    gone = asyncio.ensure_future(_wait_for_disconnect(request))
    finished = False
    n_running = len(request_ids)
    try:
        while True:
            next_event = asyncio.ensure_future(events.get())
            await asyncio.wait({next_event, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not next_event.done():
                next_event.cancel()
                return Response(status_code=499)
            event = next_event.result()
            if event.error is not None:
                finished = True
                raise ApiError(500, event.error, "server_error", code="generation_failed")
            builder.add(event)
            n_running -= event.is_final
            if n_running == 0:
                finished = True
                return JSONResponse(builder.whole())
    finally:
        gone.cancel()
        if not finished:  # the client went away (or this task was cancelled, or a choice failed): free the slots
            _cancel(state, request_ids)


def _page_template() -> jinja2.Template:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(WEBUI_DIR)), autoescape=True)
    return env.get_template("index.html")


def create_app(state: ServerState) -> Starlette:
    loaded = state.loaded
    served_name = state.model_ids[0]

    async def chat_completions(request: Request) -> Response:
        params = parse_chat(await _api_body(state, request))
        check_model(params.common.model, state.model_ids)
        _check_n(state, params.common.n)
        chat = await _chat_request(state, params, "chatcmpl")
        builders = [ResponseBuilder("chat", chat.gen.request_id, chat.common.model or served_name,
                                    loaded.model.token_bytes, chat.common.n_top_logprobs is not None,
                                    _reasoning(state, chat.gen.prompt_ids), chat.reading, index=i)
                    for i in range(len(chat.gens))]
        builder = builders[0] if len(builders) == 1 else ChoicesBuilder(builders, [g.request_id for g in chat.gens],
                                                                        len(builders))
        return await _run(state, request, chat.gens, builder, chat.common)

    async def messages(request: Request) -> Response:
        try:
            params = anthropic.parse_messages(await _api_body(state, request, anthropic.api_key(request)))
            check_model(params.common.model, state.model_ids)
            chat = await _chat_request(state, params, "msg")
            builder = anthropic.MessageBuilder(chat.gen.request_id, chat.common.model or served_name,
                                               len(chat.gen.prompt_ids), chat.common.stop,
                                               _reasoning(state, chat.gen.prompt_ids), chat.reading)
            return await _run(state, request, chat.gens, builder, chat.common)
        except ApiError as exc:
            return anthropic.error_response(exc)

    async def responses(request: Request) -> Response:
        body = await _api_body(state, request)
        params = openai_responses.parse_request(body)
        check_model(params.common.model, state.model_ids)
        chat = await _chat_request(state, params, "resp")
        builder = openai_responses.ResponsesBuilder(
            chat.gen.request_id, chat.common.model or served_name, len(chat.gen.prompt_ids),
            openai_responses.echoed(body, params), _reasoning(state, chat.gen.prompt_ids), chat.reading)
        return await _run(state, request, chat.gens, builder, chat.common)

    async def count_tokens(request: Request) -> Response:
        try:
            params = anthropic.parse_messages(await _api_body(state, request, anthropic.api_key(request)),
                                              counting=True)
            check_model(params.common.model, state.model_ids)
            chat = await _chat_request(state, params, "msg", tokenize_only=True)
            return JSONResponse({"input_tokens": len(chat.gen.prompt_ids)})
        except ApiError as exc:
            return anthropic.error_response(exc)

    async def completions(request: Request) -> Response:
        params = parse_completion(await _api_body(state, request))
        check_model(params.common.model, state.model_ids)
        if isinstance(params.prompt, tuple):
            prompt_ids = params.prompt
        else:
            _check_fits(state, len(params.prompt), "prompt")
            prompt_ids = await run_in_threadpool(loaded.text_prompt_ids, params.prompt)
        common = params.common
        _check_n(state, params.best_of, "best_of" if params.best_of > common.n else "n")
        constraints = [await _constraint(state, common) for _ in range(params.best_of)]
        scoring = params.best_of > common.n and common.n_top_logprobs is None
        engine_common = dataclasses.replace(common, n_top_logprobs=0) if scoring else common  # best_of ranks by them
        scores_prompt = params.echo and common.n_top_logprobs is not None
        gen = _generation_request(state, "cmpl", prompt_ids, engine_common, (), constraints[0],
                                  common.n_top_logprobs if scores_prompt else None)
        gens = _choices(gen, constraints)
        echo = None
        if params.echo:
            text = params.prompt if isinstance(params.prompt, str) else loaded.model.detokenize(list(prompt_ids))
            echo = (text, prompt_ids)
        builders = [ResponseBuilder("completion", gen.request_id, common.model or served_name,
                                    loaded.model.token_bytes, common.n_top_logprobs is not None, index=i, echo=echo)
                    for i in range(len(gens))]
        builder = builders[0] if len(builders) == 1 else ChoicesBuilder(builders, [g.request_id for g in gens],
                                                                        common.n)
        return await _run(state, request, gens, builder, common)

    async def embeddings(request: Request) -> Response:
        params = parse_embeddings(await _api_body(state, request))
        check_model(params.model, state.model_ids)
        if params.dimensions is not None and params.dimensions != loaded.model.n_embd:
            raise invalid(f"'dimensions' must be this model's own, {loaded.model.n_embd} (vectors are not "
                          "shortened here)", "dimensions")
        if isinstance(params.inputs[0], str):
            for text in params.inputs:
                _check_fits(state, len(text), "input")
            ids = await run_in_threadpool(lambda: [loaded.embedding_ids(t) for t in params.inputs])
        else:
            ids = [list(x) for x in params.inputs]
            if any(t >= loaded.model.n_vocab for x in ids for t in x):
                raise invalid(f"token ids must be in [0, {loaded.model.n_vocab})", "input")
        thread = await run_in_threadpool(state.embedding_thread)
        try:
            future = thread.submit(ids)
        except InputTooLongError as exc:
            raise invalid(str(exc), "input", "context_length_exceeded") from None
        vectors = await asyncio.wrap_future(future)
        data = [{"object": "embedding", "index": i,
                 "embedding": (base64.b64encode(v.astype("<f4").tobytes()).decode() if params.encoding_format == "base64"
                               else v.tolist())} for i, v in enumerate(vectors)]
        n_tokens = sum(len(x) for x in ids)
        return JSONResponse({"object": "list", "data": data, "model": params.model or served_name,
                             "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})

    async def models(request: Request) -> Response:
        _check_auth(state, request)
        data = [{"id": m, "object": "model", "created": state.created, "owned_by": "runner"} for m in state.model_ids]
        return JSONResponse({"object": "list", "data": data})

    document = openapi_document(needs_key=state.api_key is not None, max_n=loaded.options.parallel,
                                model_ids=state.model_ids)

    async def openapi(request: Request) -> Response:
        return JSONResponse(document)

    async def health(request: Request) -> Response:
        if not state.engine_thread.is_alive:
            return JSONResponse({"status": "error", "error": "the engine thread has stopped"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def slots(request: Request) -> Response:
        _check_auth(state, request)
        return JSONResponse([dataclasses.asdict(s) for s in state.engine_thread.slots()])

    async def metrics(request: Request) -> Response:
        _check_auth(state, request)
        return PlainTextResponse(render_metrics(state.engine_thread), media_type="text/plain; version=0.0.4")

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return exc.response()

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return ApiError(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}", code=code).response()

    async def server_error(request: Request, exc: Exception) -> Response:
        return ApiError(500, f"internal error: {type(exc).__name__}", "server_error").response()

    page = _page_template()

    async def index(request: Request) -> Response:
        html = page.render(model=served_name, needs_key=state.api_key is not None)
        return HTMLResponse(html, headers={"Cache-Control": "no-cache", **PAGE_HEADERS})

    routes = [
        Route("/", index, methods=["GET"]),
        Mount("/webui", app=StaticFiles(directory=str(WEBUI_DIR)), name="webui"),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/slots", slots, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # the first request would otherwise wait for these (0.2 s here, more for large vocabularies)
        await run_in_threadpool(loaded.warm_up)
        yield
        # NOTE: here, not after uvicorn returns: on SIGTERM uvicorn re-raises the signal once it has shut down
        state.close()

    handlers: dict[Any, Callable] = {ApiError: api_error, HTTPException: http_error, Exception: server_error}
    middleware = [Middleware(RequestGuard, hosts=state.hosts, cors_origins=state.cors_origins)]
    if state.cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=sorted(state.cors_origins), allow_methods=["*"],
                                     allow_headers=["*"], max_age=600))
    return Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan, middleware=middleware)
