"""HTTP/1.1 to a model process over its Unix socket: the router's one hop on every request, kept
lean (a general client cost 1.5 ms a request here). Only what runner's own server sends is read:
a status line, headers, then a Content-Length body or a chunked one; idle connections are kept."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

_MAX_HEAD_BYTES = 1 << 16
_MAX_IDLE = 16


class UpstreamError(Exception):
    """The model process cannot be reached, or its connection ended before its answer did."""


@dataclass
class UpstreamResponse:
    status: int
    headers: list[tuple[str, str]]
    _conn: _Connection
    _upstream: Upstream
    _is_chunked: bool = False
    _n_left: int = 0  # Content-Length bytes not read yet
    _is_done: bool = False
    _keeps: bool = True  # the connection may serve the next request

    def header(self, name: str) -> str:
        return next((v for k, v in self.headers if k == name), "")

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (a chunked body's chunks without their framing)."""
        reader = self._conn.reader
        try:
            if not self._is_chunked:
                if self._n_left:
                    yield await reader.readexactly(self._n_left)
                self._n_left = 0
            else:
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
                    if size == 0:
                        while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, then the end
                            pass
                        break
                    data = await reader.readexactly(size + 2)
                    yield data[:-2]
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            self._keeps = False
            raise UpstreamError(f"the model process's answer was cut: {exc!r}") from None
        self._is_done = True

    async def close(self) -> None:
        """The connection goes back to the idle ones if its answer was read whole, else it is closed
        (which tells the model process its client left: it cancels the request)."""
        if self._is_done and self._keeps:
            self._upstream.give_back(self._conn)
        else:
            self._conn.close()


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    n_requests: int = 0

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


@dataclass
class Upstream:
    """The connections to one model process's socket."""

    socket_path: Path
    _idle: list[_Connection] = field(default_factory=list)

    async def request(self, method: str, target: str, headers: list[tuple[str, str]], body: bytes = b""
                      ) -> UpstreamResponse:
        """Send the request and read the answer's head; the body is read from the response."""
        head = f"{method} {target} HTTP/1.1\r\nhost: localhost\r\ncontent-length: {len(body)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
        while True:
            conn = self._idle.pop() if self._idle else await self._connect()
            try:
                conn.writer.write(head.encode("latin-1") + body)
                await conn.writer.drain()
                raw = await conn.reader.readuntil(b"\r\n\r\n")
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
                conn.close()
                if conn.n_requests:  # a kept connection the process had closed meanwhile: a fresh one
                    continue
                raise UpstreamError(f"the model process did not answer: {exc!r}") from None
            except BaseException:  # cancelled (its client left): closing tells the process so
                conn.close()
                raise
            conn.n_requests += 1
            return self._response(raw, conn)

    async def _connect(self) -> _Connection:
        try:
            reader, writer = await asyncio.open_unix_connection(str(self.socket_path), limit=_MAX_HEAD_BYTES)
        except OSError as exc:
            raise UpstreamError(f"cannot reach the model process: {exc.strerror or exc!r}") from None
        return _Connection(reader, writer)

    def _response(self, raw: bytes, conn: _Connection) -> UpstreamResponse:
        status_line, *lines = raw.decode("latin-1").split("\r\n")
        headers = [(k.strip().lower(), v.strip()) for k, _, v in (line.partition(":") for line in lines if line)]
        response = UpstreamResponse(int(status_line.split(" ", 2)[1]), headers, conn, self)
        response._is_chunked = response.header("transfer-encoding").lower() == "chunked"
        response._n_left = int(response.header("content-length") or 0)
        response._keeps = response.header("connection").lower() != "close"
        return response

    def give_back(self, conn: _Connection) -> None:
        if len(self._idle) < _MAX_IDLE and not conn.reader.at_eof():
            self._idle.append(conn)
        else:
            conn.close()

    async def get(self, target: str) -> tuple[int, bytes]:
        response = await self.request("GET", target, [])
        try:
            return response.status, await response.read()
        finally:
            await response.close()

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
