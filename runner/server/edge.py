"""The checks every API request passes before its body is parsed: the server is up, the key, the
content type, the body's size and JSON."""

from __future__ import annotations

import hmac
from typing import Any

from starlette.requests import Request

from runner.server.errors import ApiError
from runner.server.guards import check_json_content_type, read_body
from runner.server.request_fields import parse_json
from runner.server.state import ServerState


async def api_body(state: ServerState, request: Request, key: str | None = None,
                   any_content_type: bool = False) -> dict[str, Any]:
    """An API request's JSON body, after its key (given, else the Bearer header), content type and
    size were checked (any_content_type: Ollama's clients and documented curl lines send none; the
    Origin guard already refuses the cross-site form posts the check is for)."""
    if state.is_closed:  # shutting down: the model may already be freed
        raise ApiError(503, "The server is shutting down", "server_error", code="shutting_down")
    check_auth(state, request, key)
    if not any_content_type:
        check_json_content_type(request)
    return parse_json(await read_body(request, state.max_body_bytes))


def check_auth(state: ServerState, request: Request, given: str | None = None) -> None:
    """The request's key: `given` (another dialect's header, e.g. x-api-key), else the Bearer header."""
    check_key(state.api_key, request, given)


def check_key(expected: str | None, request: Request, given: str | None = None) -> None:
    """check_auth against a key held elsewhere (None: no key needed)."""
    if expected is None:
        return
    key = given
    if key is None:
        scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
        key = bearer if scheme.lower() == "bearer" and bearer else None
    if not key:
        raise ApiError(401, "Missing API key: send 'Authorization: Bearer KEY'", code="invalid_api_key")
    if not hmac.compare_digest(key.strip().encode(), expected.encode()):
        raise ApiError(401, "Incorrect API key provided", code="invalid_api_key")
