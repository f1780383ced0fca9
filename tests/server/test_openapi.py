"""/openapi.json describes what the parser accepts (it is built from the same declarations), and a
bounded property-based run against the real app on the tiny model finds no 5xx and no response
that the document does not allow."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (content_type_conformance, not_a_server_error, response_schema_conformance,
                                 status_code_conformance)
from starlette.testclient import TestClient

from engines import load_tiny
from runner.server import openai_params
from runner.server.app import create_app
from runner.server.state import ServerState
from runner.server.engine_thread import EngineThread
from runner.server.guards import HostPolicy
from runner.server.openapi import openapi_document

MAX_EXAMPLES = 150  # per operation: bounded so the suite stays quick


@pytest.fixture(scope="module")
def app(tiny_gguf: Path) -> Iterator[object]:
    loaded = load_tiny(tiny_gguf, 2, ctx_size=96, batch_size=32)
    thread = EngineThread(loaded.engine)
    thread.start()
    # schemathesis's in-process client sends Host: testserver
    state = ServerState(loaded, thread, ["tiny"], hosts=HostPolicy.for_server("127.0.0.1", ["testserver"]))
    application = create_app(state)

    async def without_lifespan(scope, receive, send) -> None:
        """The app, but its lifespan (which closes the state) is left to this fixture: schemathesis's
        client starts and ends a lifespan for each run."""
        if scope["type"] != "lifespan":
            await application(scope, receive, send)
            return
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})

    yield without_lifespan
    state.close()


def test_the_document_lists_every_declared_parameter() -> None:
    doc = openapi_document(needs_key=False)
    chat = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {f.name for f in openai_params.CHAT_FIELDS} <= set(chat["properties"])
    assert chat["properties"]["temperature"] == {"type": "number", "description": "0: greedy", "minimum": 0.0,
                                                 "maximum": 2.0}
    assert chat["required"] == ["model", "messages"]


def test_the_server_serves_its_document(app: object) -> None:
    client = TestClient(app, base_url="http://127.0.0.1")  # no `with`: that would run (and end) the lifespan again
    assert client.get("/openapi.json").json() == openapi_document(needs_key=False, max_n=2, model_ids=["tiny"])


def test_every_dialects_generation_route_is_documented() -> None:
    doc = openapi_document(needs_key=True, model_ids=["tiny"])
    assert set(doc["paths"]) == {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
                                 "/v1/messages/count_tokens", "/v1/models", "/health", "/api/chat", "/api/generate",
                                 "/api/embed", "/api/show", "/api/tags", "/api/ps", "/api/version"}
    responses = doc["paths"]["/v1/responses"]["post"]
    assert {"completed_at", "previous_response_id", "max_tool_calls", "reasoning"} <= set(
        responses["responses"]["200"]["content"]["application/json"]["schema"]["required"])
    messages = doc["paths"]["/v1/messages"]["post"]
    assert messages["requestBody"]["content"]["application/json"]["schema"]["properties"]["model"]["enum"] == ["tiny"]
    error = messages["responses"]["401"]["content"]["application/json"]["schema"]
    assert error["properties"]["type"]["enum"] == ["error"]  # Anthropic's envelope, not OpenAI's


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
                                  "/v1/messages/count_tokens", "/v1/models", "/health", "/api/chat", "/api/generate",
                                  "/api/embed", "/api/show", "/api/tags", "/api/ps", "/api/version"])
def test_no_input_gets_a_5xx_or_an_undocumented_response(app: object, path: str) -> None:
    """schemathesis generates bodies from the document, valid and invalid; hypothesis runs them."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    operation = next(op for op in operations if op.path == path)

    @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy())
    def run(case) -> None:
        case.call_and_validate(checks=[not_a_server_error, status_code_conformance, content_type_conformance,
                                       response_schema_conformance],
                               timeout=120)  # a deadline, not a speed: a fully loaded machine took over 10 s

    run()
