"""A lean load generator: many streaming chat clients over raw sockets, all on one thread.

The benchmarks share 2 cores with the server under test, so the clients' CPU time comes out of
llama.cpp's threads (a thread taken off a core stalls the graph at its next barrier). httpx in one
thread per client spent about 0.5 ms of CPU per streamed token here, more than the server's own
event loop. This client parses only what the bench measures: the first content chunk (time to
first token) and the usage chunk.
"""

from __future__ import annotations

import json
import re
import selectors
import socket
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

# (json.dumps spacing, as runner writes, or compact, as llama.cpp's server writes)
CONTENT = re.compile(rb'"content": ?"(?!")')  # a chunk with text in it
USAGE_CHUNK = re.compile(rb'"choices": ?\[\]')  # stream_options.include_usage's last chunk
# Once a reply's first token is in (time to first token taken), the client is woken only when
# this many bytes wait (or the server closes): a chunk is ~200 bytes, so a wake-up per ~10
# tokens instead of one per token, each of which took a core from llama.cpp's threads.
RCVLOWAT_BYTES = 2048
# A quiet spell this long: read what waits below the low-water mark (a reply whose [DONE] is in
# but whose connection the server has not closed yet: seen once from llama-server at 8 clients);
# quiet this many spells in a row, the run fails instead of hanging.
QUIET_S = 5.0
QUIET_SPELLS_MAX = 12


@dataclass
class _Client:
    bodies: list[bytes]
    sock: socket.socket | None = None
    buffer: bytes = b""
    head_checked: bool = False
    sent_s: float = 0.0
    first_s: float | None = None
    ttfts: list[float] = field(default_factory=list)
    n_tokens: int = 0
    is_done: bool = False  # the reply's data: [DONE] is in


@dataclass(frozen=True)
class LoadResult:
    elapsed_s: float
    n_tokens: int  # completion tokens, summed from each reply's usage chunk
    ttfts: list[float]


def run_clients(url: str, plan: list[list[dict]]) -> LoadResult:
    """Each inner list is one client's chat-completion bodies, sent one after another, streamed."""
    where = urlsplit(url)
    address = (where.hostname or "127.0.0.1", where.port or 80)
    selector = selectors.DefaultSelector()
    clients = [_Client([_request(where.netloc, body) for body in bodies]) for bodies in plan if bodies]
    started = time.perf_counter()
    for client in clients:
        _send_next(client, address, selector)
    n_quiet = 0
    while selector.get_map():
        ready = selector.select(QUIET_S)
        if not ready:
            n_quiet += 1
            if n_quiet >= QUIET_SPELLS_MAX:
                raise TimeoutError(f"{url} sent nothing for {QUIET_S * QUIET_SPELLS_MAX:.0f} s")
            for key in list(selector.get_map().values()):
                _drain(key.data, address, selector)
            continue
        n_quiet = 0
        for key, _ in ready:
            client: _Client = key.data
            assert client.sock is not None
            data = client.sock.recv(65536)
            if data:
                _consume(client, data)
                continue
            _next(client, address, selector)
    elapsed = time.perf_counter() - started
    selector.close()
    return LoadResult(elapsed, sum(c.n_tokens for c in clients), [t for c in clients for t in c.ttfts])


def _request(host: str, body: dict) -> bytes:
    payload = json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n")
    return head.encode() + payload


def _next(client: _Client, address: tuple[str, int], selector: selectors.BaseSelector) -> None:
    """The client's reply has ended: its connection closed, the next request sent."""
    assert client.sock is not None
    selector.unregister(client.sock)
    client.sock.close()
    client.ttfts.append(client.first_s - client.sent_s if client.first_s is not None else float("nan"))
    if client.bodies:
        _send_next(client, address, selector)


def _drain(client: _Client, address: tuple[str, int], selector: selectors.BaseSelector) -> None:
    """After a quiet spell: what waits below the low-water mark; a reply ended by [DONE] is over."""
    assert client.sock is not None
    try:
        data = client.sock.recv(65536, socket.MSG_DONTWAIT)
    except BlockingIOError:
        data = None
    if data:
        _consume(client, data)
    if data == b"" or client.is_done:
        _next(client, address, selector)


def _send_next(client: _Client, address: tuple[str, int], selector: selectors.BaseSelector) -> None:
    client.sock = socket.create_connection(address)
    client.buffer, client.head_checked, client.first_s, client.is_done = b"", False, None, False
    client.sent_s = time.perf_counter()
    client.sock.sendall(client.bodies.pop(0))
    selector.register(client.sock, selectors.EVENT_READ, client)


def _consume(client: _Client, data: bytes) -> None:
    client.buffer += data
    if not client.head_checked:
        if b"\r\n" not in client.buffer:
            return
        status = client.buffer.split(b"\r\n", 1)[0]
        if b" 200 " not in status + b" ":
            raise RuntimeError(f"server answered {status.decode(errors='replace')}: {client.buffer[:400]!r}")
        client.head_checked = True
    *lines, client.buffer = client.buffer.split(b"\n")
    for line in lines:
        if line.startswith(b"data: [DONE]"):
            client.is_done = True
        if not line.startswith(b"data: {"):
            continue
        if client.first_s is None and CONTENT.search(line):
            client.first_s = time.perf_counter()
            assert client.sock is not None
            client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, RCVLOWAT_BYTES)
        elif b'"usage"' in line and USAGE_CHUNK.search(line):
            client.n_tokens += json.loads(line[6:])["usage"]["completion_tokens"]
