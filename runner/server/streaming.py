"""Run a request's generations and answer: a stream of the dialect's events, or the whole reply
once every choice has ended. A client that goes away cancels its requests at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from runner.scheduler.request import FinishReason, GenerationRequest, StreamEvent
from runner.scheduler.scheduler import QueueFullError
from runner.server.engine_thread import EngineStoppedError
from runner.server.errors import ApiError
from runner.server.state import ServerState

RETRY_AFTER_S = 1


class ReplyBuilder(Protocol):
    """What every dialect's reply builder answers (a chat or completion reply, n choices, a
    Response, an Anthropic message): the stream's frame and chunks, or the whole reply."""

    def add(self, event: StreamEvent) -> None: ...
    def whole(self) -> dict[str, Any]: ...
    def stream_start(self) -> str: ...
    def chunk_sse(self, event: StreamEvent) -> str | None: ...  # None: nothing to send for this event
    def stream_error(self, message: str, code: str = "generation_failed") -> str: ...
    def stream_end(self, include_usage: bool) -> str: ...


async def run(state: ServerState, request: Request, groups: list[list[GenerationRequest]], builder: ReplyBuilder,
              stream: bool, include_usage: bool = False, headers: dict[str, str] | None = None,
              media_type: str = "text/event-stream") -> Response:
    """Submit the request's generations (per prompt, one per choice) and answer: a stream (server-sent
    events, or the dialect's own media type), or the whole reply (with these headers either way)."""
    events: asyncio.Queue[StreamEvent] = asyncio.Queue()
    sink = state.event_pump().sink_for(events)
    try:
        state.engine_thread.submit_groups(groups, [[sink] * len(group) for group in groups])
    except QueueFullError as exc:
        raise ApiError(503, f"The server is busy: {exc}; retry shortly", "server_error", code="queue_full",
                       headers={"Retry-After": str(RETRY_AFTER_S)}) from None
    except EngineStoppedError as exc:
        raise ApiError(503, str(exc), "server_error", code="engine_stopped") from None
    ids = [gen.request_id for group in groups for gen in group]
    if stream:
        return StreamingResponse(_stream(state, ids, events, builder, include_usage),
                                 media_type=media_type, headers={"Cache-Control": "no-cache", **(headers or {})})
    return await _collect(state, request, ids, events, builder, headers or {})


def _cancel(state: ServerState, request_ids: list[str]) -> None:
    for request_id in request_ids:
        state.engine_thread.cancel(request_id)


async def _stream(state: ServerState, request_ids: list[str], events: asyncio.Queue[StreamEvent],
                  builder: ReplyBuilder, include_usage: bool) -> AsyncIterator[str]:
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
                    code = "shutting_down" if event.finish_reason is FinishReason.CANCELLED else "generation_failed"
                    yield "".join(out) + builder.stream_error(event.error, code)
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


async def wait_for_disconnect(request: Request) -> None:
    """Returns once the client has gone (the body was read, so the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _collect(state: ServerState, request: Request, request_ids: list[str], events: asyncio.Queue[StreamEvent],
                   builder: ReplyBuilder, headers: dict[str, str]) -> Response:
    """A whole (non-streamed) reply; a client that leaves meanwhile cancels its request at once."""
    gone = asyncio.ensure_future(wait_for_disconnect(request))
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
            if event.error is not None:  # (the finally below cancels the request's other choices)
                if event.finish_reason is FinishReason.CANCELLED:  # (the server is shutting down)
                    raise ApiError(503, event.error, "server_error", code="shutting_down")
                raise ApiError(500, event.error, "server_error", code="generation_failed")
            builder.add(event)
            n_running -= event.is_final
            if n_running == 0:
                finished = True
                return JSONResponse(builder.whole(), headers=headers)
    finally:
        gone.cancel()
        if not finished:  # the client went away (or this task was cancelled, or a choice failed): free the slots
            _cancel(state, request_ids)
