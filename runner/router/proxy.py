"""A request passed on to a model's process and its answer passed back, streamed as it comes; a
client that goes away closes the upstream request, which cancels the generation there."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import httpx
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from runner.server.errors import ApiError

# headers that describe one connection, not the message (RFC 9110 7.6.1), or that the server sets itself;
# Host and Origin were checked here (the model process would see a foreign origin on its private socket)
_REQUEST_DROP = {"host", "origin", "connection", "keep-alive", "transfer-encoding", "content-length", "te", "upgrade"}
_RESPONSE_DROP = {"connection", "keep-alive", "transfer-encoding", "content-length", "date", "server"}


async def forward(client: httpx.AsyncClient, request: Request, body: bytes, model: str,
                  on_done: Callable[[], None]) -> Response:
    """The model process's answer to this request; on_done runs once when it has been passed on
    (or failed)."""
    headers = [(k, v) for k, v in request.headers.raw if k.decode("latin-1").lower() not in _REQUEST_DROP]
    upstream_request = client.build_request(request.method, request.url.path, params=request.url.query,
                                            headers=headers, content=body)
    try:
        upstream = await client.send(upstream_request, stream=True)
    except httpx.TransportError:
        on_done()
        raise ApiError(502, f"the model process for '{model}' is not answering (it may have crashed); the next "
                            "request loads it again", "server_error", code="model_process_failed") from None
    except BaseException:
        on_done()
        raise
    response_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _RESPONSE_DROP}
    if not upstream.headers.get("content-type", "").startswith("text/event-stream"):
        try:
            content = await upstream.aread()
        except httpx.TransportError:
            raise ApiError(502, f"the model process for '{model}' stopped while answering", "server_error",
                           code="model_process_failed") from None
        finally:
            await upstream.aclose()
            on_done()
        return Response(content, status_code=upstream.status_code, headers=response_headers)
    return _RelayedStream(upstream, on_done, response_headers)


class _RelayedStream(StreamingResponse):
    """The model process's stream, passed on chunk by chunk; however it ends (done, the client gone
    before or during it, the process gone), the upstream request is closed and on_done runs once."""

    def __init__(self, upstream: httpx.Response, on_done: Callable[[], None], headers: dict[str, str]) -> None:
        super().__init__(_chunks(upstream), status_code=upstream.status_code, headers=headers)
        self._upstream, self._on_done = upstream, on_done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._upstream.aclose()
            self._on_done()


async def _chunks(upstream: httpx.Response) -> AsyncIterator[bytes]:
    try:
        async for chunk in upstream.aiter_raw():
            yield chunk
    except httpx.TransportError:
        return  # the process ended mid-stream: the client sees the stream end without its final event
