"""What a request must pass before any work is done: the Host it was sent to, the page it came
from, its content type and its body size. Each refusal is in the envelope of the API asked (the
app's choice, by path: OpenAI's, Anthropic's, Ollama's).

Why: a server on 127.0.0.1 is reachable from every web page the user opens. A page may send a
"simple" cross-site POST (text/plain, no preflight) and, through DNS rebinding (its own name
pointed at 127.0.0.1), read the answers. Only JSON bodies, a known Host and no foreign Origin
keep the API to the user's own programs and the built-in page.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from starlette.datastructures import MutableHeaders
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runner.server.errors import ApiError

JSON_MEDIA_TYPE = "application/json"
MAX_JSON_DEPTH = 64  # nesting of objects and arrays in a request body
DEFAULT_MAX_BODY_BYTES = 8_000_000  # --max-body-mb's default: far above any prompt a slot can hold
# the built-in page loads only its own files, talks only to its own origin and is never framed
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; connect-src 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
EVERY_RESPONSE_HEADERS = {"X-Content-Type-Options": "nosniff"}


def _host_name(host_header: str) -> str:
    """'[::1]:8080' -> '::1', 'Example.com:80' -> 'example.com'."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class HostPolicy:
    """Host names the server answers to: IP literals (a rebinding attack needs a name), localhost,
    the bound name, this machine's name and --allowed-hosts ('*': any)."""

    names: frozenset[str]

    @classmethod
    def for_server(cls, bound_host: str, extra: Iterable[str] = ()) -> HostPolicy:
        names = {"localhost", socket.gethostname().lower(), _host_name(bound_host)}
        names.update(_host_name(h) for h in extra)
        return cls(frozenset(n for n in names if n))

    def allows(self, host_header: str | None) -> bool:
        if "*" in self.names:
            return True
        if not host_header:
            return False
        name = _host_name(host_header)
        return _is_ip(name) or name in self.names or name.endswith(".localhost")


def check_host(policy: HostPolicy, request: Request) -> None:
    host = request.headers.get("host")
    if not policy.allows(host):
        if host is None:
            raise ApiError(403, "a request must name its Host (DNS rebinding protection)", code="host_not_allowed")
        raise ApiError(403, f"Host '{host}' is not allowed (DNS rebinding protection); start the server with "
                            f"--allowed-hosts NAME to answer to it", code="host_not_allowed")


def check_origin(request: Request, cors_origins: frozenset[str]) -> None:
    """A browser names the page that sent a request in Origin: the server's own page, an allowed
    CORS origin, or none (programs) may call the API."""
    origin = request.headers.get("origin")
    if origin is None or origin in cors_origins or "*" in cors_origins:
        return
    own = f"{request.url.scheme}://{request.headers.get('host', '')}"
    if origin.lower() != own.lower():
        raise ApiError(403, f"Cross-origin requests from {origin} are not allowed; start the server with "
                            f"--cors-origins {origin} to allow them", code="origin_not_allowed")


def check_json_content_type(request: Request) -> None:
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != JSON_MEDIA_TYPE:
        shown = media_type or "none"
        raise ApiError(415, f"Content-Type must be {JSON_MEDIA_TYPE}, got {shown}", code="unsupported_media_type")


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed max_bytes (before reading it
    all when Content-Length says so)."""
    too_large = ApiError(413, f"The request body is over the {max_bytes / 1e6:g} MB limit (--max-body-mb)",
                         code="request_too_large")
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise ApiError(400, "Content-Length is not a number", code="invalid_request")
        if int(declared) > max_bytes:
            raise too_large
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise too_large
            chunks.append(chunk)
    except ClientDisconnect:  # (nobody reads the answer: it only keeps the log free of a traceback)
        raise ApiError(499, "the client left before its request's body arrived", code="client_disconnected") from None
    return b"".join(chunks)


def check_json_value(value: object, depth: int = 0) -> None:
    """Refuse what parsed but cannot be used: nesting deeper than MAX_JSON_DEPTH and strings with
    lone surrogates (they cannot be encoded for the tokenizer)."""
    if depth > MAX_JSON_DEPTH:
        raise ApiError(400, f"the request body nests deeper than {MAX_JSON_DEPTH} levels", code="invalid_json")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            shown = json.dumps(value[:40])
            raise ApiError(400, f"a string in the request body is not valid Unicode (a lone surrogate): {shown}",
                           code="invalid_json") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            check_json_value(key, depth + 1)
            check_json_value(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            check_json_value(item, depth + 1)


class RequestGuard:
    """ASGI middleware: Host and Origin checked on every request before any route runs, and
    nosniff on every response."""

    def __init__(self, app: ASGIApp, hosts: HostPolicy, cors_origins: frozenset[str],
                 refusal: Callable[[str, ApiError], Response] = lambda path, exc: exc.response()) -> None:
        """`refusal`: the error's response for a path (the app's: each dialect's own envelope)."""
        self.app = app
        self.hosts = hosts
        self.cors_origins = cors_origins
        self.refusal = refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        try:
            check_host(self.hosts, request)
            check_origin(request, self.cors_origins)
        except ApiError as exc:
            await self.refusal(scope["path"], exc)(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in EVERY_RESPONSE_HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, send_with_headers)
