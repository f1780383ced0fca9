"""What a request must pass before work is done: Host, Origin, content type, body size, headers.

Driven through the real app in-process (tiny model): each refusal is the envelope and status a
client sees, and nothing reaches the engine."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.requests import Request
from starlette.testclient import TestClient

from engines import load_tiny
from runner.server.app import create_app
from runner.server.state import ServerState
from runner.server.engine_thread import EngineThread
from runner.server.errors import ApiError
from runner.server.guards import HostPolicy, read_body

BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def state(tiny_gguf: Path) -> Iterator[ServerState]:
    loaded = load_tiny(tiny_gguf, 2, ctx_size=128, batch_size=32)
    thread = EngineThread(loaded.engine)
    thread.start()
    st = ServerState(loaded, thread, ["tiny"], hosts=HostPolicy.for_server("127.0.0.1", ["runner.lan"]),
                     cors_origins=frozenset({"https://app.example"}), max_body_bytes=10_000)
    yield st
    st.close()


@pytest.fixture(scope="module")
def client(state: ServerState) -> Iterator[TestClient]:  # one for the module: leaving it closes the state
    with TestClient(create_app(state), base_url="http://127.0.0.1:8080") as c:
        yield c


def n_requests(state: ServerState) -> int:
    return state.loaded.engine.stats.n_requests


def error(r) -> tuple[int, str]:
    return r.status_code, r.json()["error"]["code"]


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", "127.0.0.1.evil.example", ""])
def test_a_foreign_host_is_refused_before_anything_runs(client: TestClient, state: ServerState, host: str) -> None:
    before = n_requests(state)
    r = client.post("/v1/chat/completions", json=BODY, headers={"Host": host})
    assert error(r) == (403, "host_not_allowed")
    assert "--allowed-hosts" in r.json()["error"]["message"]
    assert client.get("/", headers={"Host": host}).status_code == 403  # the page too: it would carry the key
    assert n_requests(state) == before


@pytest.mark.parametrize("host", ["127.0.0.1:8080", "localhost:8080", "[::1]:8080", "192.168.1.20", "runner.lan",
                                  "app.localhost"])
def test_ip_literals_localhost_and_allowed_names_are_served(client: TestClient, host: str) -> None:
    assert client.get("/health", headers={"Host": host}).status_code == 200


def test_host_policy_star_allows_any() -> None:
    assert HostPolicy.for_server("0.0.0.0", ["*"]).allows("anything.example")
    assert not HostPolicy.for_server("0.0.0.0").allows("anything.example")


def test_a_cross_site_text_plain_post_is_refused_with_415(client: TestClient, state: ServerState) -> None:
    before = n_requests(state)
    r = client.post("/v1/chat/completions", content=b'{"messages": [{"role": "user", "content": "hi"}]}',
                    headers={"Content-Type": "text/plain"})
    assert error(r) == (415, "unsupported_media_type")
    assert error(client.post("/v1/completions", content=b'{"prompt": "x"}')) == (415, "unsupported_media_type")
    assert n_requests(state) == before


def test_json_with_a_charset_is_fine(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", content=b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], '
                    b'"max_tokens": 1}', headers={"Content-Type": "application/json; charset=utf-8"})
    assert r.status_code == 200


def test_a_foreign_origin_is_refused_and_an_allowed_one_gets_cors(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json=BODY, headers={"Origin": "https://evil.example"})
    assert error(r) == (403, "origin_not_allowed")
    ok = client.post("/v1/chat/completions", json=BODY, headers={"Origin": "https://app.example"})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "https://app.example"
    preflight = client.options("/v1/chat/completions", headers={
        "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, authorization"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "https://app.example"
    assert "POST" in preflight.headers["access-control-allow-methods"]
    bad = client.options("/v1/chat/completions", headers={"Origin": "https://evil.example",
                                                          "Access-Control-Request-Method": "POST"})
    assert bad.status_code == 403 and "access-control-allow-origin" not in bad.headers


def test_the_built_in_page_may_call_its_own_origin(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json=BODY, headers={"Origin": "http://127.0.0.1:8080"})
    assert r.status_code == 200


def test_a_body_over_the_limit_gets_413_before_it_is_read(client: TestClient, state: ServerState) -> None:
    before = n_requests(state)
    big = b'{"messages": [{"role": "user", "content": "' + b"x" * 20_000 + b'"}]}'
    r = client.post("/v1/chat/completions", content=big, headers={"Content-Type": "application/json"})
    assert error(r) == (413, "request_too_large")

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield big[:8000]
        yield big[8000:]

    r = client.post("/v1/chat/completions", content=chunks(), headers={"Content-Type": "application/json"})
    assert error(r) == (413, "request_too_large")
    assert n_requests(state) == before


def test_the_page_sends_security_headers_and_every_response_nosniff(client: TestClient) -> None:
    page = client.get("/")
    assert page.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert client.get("/v1/models").headers["x-content-type-options"] == "nosniff"
    assert client.get("/webui/app.js").headers["x-content-type-options"] == "nosniff"


def test_a_prompt_that_cannot_fit_is_refused_before_it_is_tokenized(client: TestClient, state: ServerState,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: object) -> None:
        raise AssertionError("tokenized")

    monkeypatch.setattr(state.loaded, "text_prompt_ids", never)
    monkeypatch.setattr(state.loaded, "chat_prompt_ids", never)
    n_chars = 128 * state.loaded.model.max_token_bytes  # even at the longest token each: over 128
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": "x" * n_chars})
    assert error(r) == (400, "context_length_exceeded") and r.json()["error"]["param"] == "prompt"
    r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "x" * n_chars}]})
    assert error(r) == (400, "context_length_exceeded") and r.json()["error"]["param"] == "messages"


def test_a_client_that_leaves_mid_body_is_a_quiet_499() -> None:
    messages = iter([{"type": "http.request", "body": b'{"messa', "more_body": True}, {"type": "http.disconnect"}])

    async def receive() -> dict:
        return next(messages)

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [(b"content-length", b"999")]}
    with pytest.raises(ApiError) as caught:
        asyncio.run(read_body(Request(scope, receive), max_bytes=1000))
    assert (caught.value.status, caught.value.code) == (499, "client_disconnected")


def test_a_request_without_a_host_is_told_so() -> None:
    from runner.server.guards import check_host

    scope = {"type": "http", "method": "GET", "path": "/v1/models", "headers": []}  # (HTTP/1.0 may send none)
    with pytest.raises(ApiError) as caught:
        check_host(HostPolicy.for_server("127.0.0.1"), Request(scope))
    assert caught.value.message == "a request must name its Host (DNS rebinding protection)"


def test_a_refusal_under_api_is_in_ollamas_envelope(client: TestClient, state: ServerState) -> None:
    """Ollama's clients read {"error": "..."} (the official one's ResponseError.error was a dict)."""
    before = n_requests(state)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}]}
    by_origin = client.post("/api/chat", json=body, headers={"Origin": "http://evil.example"})
    assert (by_origin.status_code, by_origin.json()) == (403, {"error": (
        "Cross-origin requests from http://evil.example are not allowed; start the server with "
        "--cors-origins http://evil.example to allow them")})
    by_host = client.post("/api/chat", json=body, headers={"Host": "evil.example"})
    assert (by_host.status_code, by_host.json()) == (403, {"error": (
        "Host 'evil.example' is not allowed (DNS rebinding protection); start the server with "
        "--allowed-hosts NAME to answer to it")})
    assert n_requests(state) == before
    documented = client.get("/openapi.json").json()["paths"]["/api/chat"]["post"]["responses"]["403"]
    schema = documented["content"]["application/json"]["schema"]
    assert (schema["properties"], schema["required"]) == ({"error": {"type": "string"}}, ["error"])
    assert documented["description"] == "Host or Origin not allowed"
    anthropic = client.post("/v1/messages", json=body, headers={"Origin": "http://evil.example"})
    assert (anthropic.status_code, anthropic.json()["type"], anthropic.json()["error"]["type"]) == (
        403, "error", "permission_error")
    documented = client.get("/openapi.json").json()["paths"]["/v1/messages"]["post"]["responses"]["403"]
    assert documented["content"]["application/json"]["schema"]["properties"]["type"] == {"type": "string",
                                                                                       "enum": ["error"]}
