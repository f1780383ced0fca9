"""A request passed on to a model's process and its answer passed back, streamed as it comes; a
client that goes away closes the upstream connection, which cancels the generation there."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from runner.router.upstream import Upstream, UpstreamError, UpstreamResponse
from runner.server.errors import ApiError
from runner.server.streaming import wait_for_disconnect

# headers that describe one connection, not the message (RFC 9110 7.6.1), or that either side sets itself;
# Host and Origin were checked here (the model process would see a foreign origin on its private socket)
_REQUEST_DROP = {"host", "origin", "connection", "keep-alive", "transfer-encoding", "content-length", "te", "upgrade"}
_RESPONSE_DROP = {"connection", "keep-alive", "transfer-encoding", "content-length", "date", "server"}
T = TypeVar("T")
STREAMED_TYPES = ("text/event-stream", "application/x-ndjson")  # server-sent events; Ollama's lines
_LOAD_DURATION = b'"load_duration"'  # (a string's own quotes are escaped: only a key matches)


async def forward(upstream: Upstream, request: Request, body: bytes, model: str,
                  on_done: Callable[[], None], load_ns: int = 0) -> Response:
    """The model process's answer to this request; on_done runs once when it has been passed on
    (or failed, or the client left). load_ns: how long the request waited here for its model to
    load, added to an Ollama reply's durations."""
    headers = [(k, v) for k, v in request.headers.items() if k not in _REQUEST_DROP]
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    gone = asyncio.ensure_future(wait_for_disconnect(request))  # (the body was read: what comes next is the end)
    answer: UpstreamResponse | None = None
    is_streamed = False
    try:
        answer = await _unless_gone(gone, upstream.request(request.method, target, headers, body))
        response_headers = {k: v for k, v in answer.headers if k not in _RESPONSE_DROP}
        if answer.header("content-type").startswith(STREAMED_TYPES):
            gone.cancel()  # the stream watches for its client from here on, and calls on_done
            is_streamed = True
            return _RelayedStream(answer, on_done, response_headers, request.url.path, model, load_ns)
        content = await _unless_gone(gone, answer.read())
        return Response(_with_load_time(content, load_ns), status_code=answer.status, headers=response_headers)
    except _ClientGone:  # closing the upstream connection (below) cancels the generation there
        return Response(status_code=499)
    except UpstreamError:
        if answer is None:
            raise ApiError(502, f"the model process for '{model}' is not answering (it may have crashed); the next "
                                "request loads it again", "server_error", code="model_process_failed") from None
        raise ApiError(502, f"the model process for '{model}' stopped while answering", "server_error",
                       code="model_process_failed") from None
    finally:
        if not is_streamed:
            gone.cancel()
            if answer is not None:
                await answer.close()
            on_done()


class _ClientGone(Exception):
    """The client left before its answer was passed on."""


async def _unless_gone(gone: asyncio.Future[None], work: Awaitable[T]) -> T:
    """work's result, unless the client leaves first (then work is cancelled and _ClientGone raised)."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
    if task.cancelled():
        raise _ClientGone
    return task.result()


class _RelayedStream(StreamingResponse):
    """The model process's stream, passed on chunk by chunk; however it ends (done, the client gone
    before or during it, the process gone), the upstream answer is closed and on_done runs once."""

    def __init__(self, answer: UpstreamResponse, on_done: Callable[[], None], headers: dict[str, str], path: str,
                 model: str, load_ns: int) -> None:
        chunks = _chunks(answer, path, model)
        super().__init__(_lines_with_load_time(chunks, load_ns) if load_ns else chunks, status_code=answer.status,
                         headers=headers)
        self._answer, self._on_done = answer, on_done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._answer.close()
            self._on_done()


async def _chunks(answer: UpstreamResponse, path: str, model: str) -> AsyncIterator[bytes]:
    last = b"\n"
    try:
        async for chunk in answer.chunks():
            last = chunk or last
            yield chunk
    except UpstreamError:  # the process ended mid-stream: the stream ends with the dialect's error event
        message = f"the model process for '{model}' stopped while answering (it may have crashed); the next request loads it again"
        gap = b"" if last.endswith(b"\n") else b"\n" if path.startswith("/api/") else b"\n\n"  # (NDJSON: no blank line)
        yield gap + failure_event(path, message, last).encode()


async def _lines_with_load_time(chunks: AsyncIterator[bytes], load_ns: int) -> AsyncIterator[bytes]:
    """Ollama's NDJSON stream, line by line, its final object given the load time (_with_load_time)."""
    rest = b""  # a line whose end has not come yet
    async for chunk in chunks:
        *lines, rest = (rest + chunk).split(b"\n")
        if lines:
            yield b"".join(_with_load_time(line, load_ns) + b"\n" for line in lines)
    if rest:
        yield _with_load_time(rest, load_ns)


def _with_load_time(reply: bytes, load_ns: int) -> bytes:
    """An Ollama reply object with the time its request waited for the model to load added to its
    load_duration and total_duration, as Ollama counts them (the model's process, loaded by then,
    says 0 and leaves it out); any other reply as it is."""
    if not load_ns or _LOAD_DURATION not in reply:
        return reply
    try:
        body = json.loads(reply)
    except ValueError:
        return reply
    if not isinstance(body, dict) or not isinstance(body.get("load_duration"), int):
        return reply
    body["load_duration"] += load_ns
    body["total_duration"] = body.get("total_duration", 0) + load_ns
    return json.dumps(body, ensure_ascii=False).encode()


def failure_event(path: str, message: str, last: bytes) -> str:
    """The event that ends a stream whose process is gone, in the stream's own dialect."""
    if path.startswith("/api/"):  # Ollama: NDJSON
        return json.dumps({"error": message}) + "\n"
    if path.startswith("/v1/messages"):
        body = {"type": "error", "error": {"type": "api_error", "message": message}}
        return f"event: error\ndata: {json.dumps(body)}\n\n"
    if path.startswith("/v1/responses"):  # its events are numbered: this one follows the last relayed
        numbers = re.findall(rb'"sequence_number": ?(\d+)', last)
        body = {"type": "error", "sequence_number": int(numbers[-1]) + 1 if numbers else 0,
                "code": "model_process_failed", "message": message, "param": None}
        return f"event: error\ndata: {json.dumps(body)}\n\n"
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": "model_process_failed"}}
    return f"data: {json.dumps(body)}\n\n"
