"""Every Responses and Messages reply, whole and streamed, text and tool calls, validates against the
published schemas (dialect_schemas, written from the specs): the checks a third-party compliance
tool runs, as tests of our own, on the real app with the tiny model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from starlette.testclient import TestClient

import dialect_schemas as published
from engines import in_process_server, load_tiny

TOOL = {"name": "get_weather", "description": "Get the weather in a city",
        "schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 3}},
                   "required": ["city"], "additionalProperties": False}}
RESPONSES_TOOL = {"type": "function", "name": TOOL["name"], "description": TOOL["description"],
                  "parameters": TOOL["schema"]}
MESSAGES_TOOL = {"name": TOOL["name"], "description": TOOL["description"], "input_schema": TOOL["schema"]}


@pytest.fixture(scope="module")
def client(tiny_gguf: Path) -> Iterator[TestClient]:
    with in_process_server(load_tiny(tiny_gguf, 2, ctx_size=512)) as c:
        yield c


def valid(instance: Any, schema: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator(schema).validate(instance)


def sse(text: str) -> list[tuple[str | None, dict[str, Any]]]:
    """(event name, data) per server-sent event, in order."""
    out, name = [], None
    for line in text.splitlines():
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            out.append((name, json.loads(line.removeprefix("data: "))))
            name = None
    return out


def streamed(client: TestClient, path: str, body: dict[str, Any],
             schemas: dict[str, dict[str, Any]]) -> list[tuple[str | None, dict[str, Any]]]:
    """The streamed reply's events, each named for its type and valid against that type's schema
    (a KeyError: an event type the spec does not have)."""
    reply = client.post(path, json={"model": "tiny", "temperature": 0, "stream": True, **body})
    assert reply.status_code == 200, reply.text
    events = sse(reply.text)
    for name, data in events:
        assert name == data["type"]
        valid(data, schemas[data["type"]])
    return events


# -- Responses ----------------------------------------------------------------------------------
RESPONSES_CASES = {
    "text": {"input": "Say hello", "max_output_tokens": 6},
    "instructions and developer": {"instructions": "Be brief.", "max_output_tokens": 6, "input": [
        {"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "hello"}]},
    "tool call": {"input": "Weather in Paris?", "tools": [RESPONSES_TOOL], "tool_choice": "required",
                  "max_output_tokens": 200},
    "agent fields": {"input": "hi", "max_output_tokens": 4, "reasoning": {"summary": "auto"}, "store": False,
                     "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k", "metadata": {"a": "b"},
                     "tools": [{"type": "web_search"}]},
}


@pytest.mark.parametrize("case", RESPONSES_CASES)
def test_a_whole_response_matches_the_open_responses_schema(client: TestClient, case: str) -> None:
    reply = client.post("/v1/responses", json={"model": "tiny", "temperature": 0, **RESPONSES_CASES[case]})
    assert reply.status_code == 200, reply.text
    valid(reply.json(), published.FINAL_RESPONSE)
    if case == "tool call":
        assert [item["type"] for item in reply.json()["output"]] == ["function_call"]


@pytest.mark.parametrize("case", RESPONSES_CASES)
def test_a_streamed_response_matches_the_open_responses_event_schemas(client: TestClient, case: str) -> None:
    events = streamed(client, "/v1/responses", RESPONSES_CASES[case], published.RESPONSES_EVENTS)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert events[-1][0] in ("response.completed", "response.incomplete")
    added = [data["item"]["id"] for _, data in events if data["type"] == "response.output_item.added"]
    done = [data["item"]["id"] for _, data in events if data["type"] == "response.output_item.done"]
    assert added == done == [item["id"] for item in events[-1][1]["response"]["output"]]


def test_an_incomplete_response_says_why(client: TestClient) -> None:
    reply = client.post("/v1/responses", json={"model": "tiny", "input": "Count to fifty", "max_output_tokens": 2,
                                               "temperature": 0})
    valid(reply.json(), published.FINAL_RESPONSE)
    assert (reply.json()["status"], reply.json()["incomplete_details"]) == ("incomplete",
                                                                           {"reason": "max_output_tokens"})


# -- Messages -----------------------------------------------------------------------------------
MESSAGES_CASES = {
    "text": {"messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 6},
    "system blocks and message": {"system": [{"type": "text", "text": "Be brief."}], "max_tokens": 6, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hello"}]}, {"role": "system", "content": "Mind."}]},
    "tool use": {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [MESSAGES_TOOL],
                 "tool_choice": {"type": "any"}, "max_tokens": 200},
    "agent fields": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                     "thinking": {"type": "adaptive"}, "metadata": {"user_id": "u"},
                     "context_management": {"edits": []}, "output_config": {"effort": "low"}},
}


@pytest.mark.parametrize("case", MESSAGES_CASES)
def test_a_whole_message_matches_anthropics_schema(client: TestClient, case: str) -> None:
    reply = client.post("/v1/messages", json={"model": "tiny", "temperature": 0, **MESSAGES_CASES[case]})
    assert reply.status_code == 200, reply.text
    valid(reply.json(), published.MESSAGE)
    if case == "tool use":
        assert [b["type"] for b in reply.json()["content"]] == ["tool_use"]
        assert reply.json()["stop_reason"] == "tool_use"


@pytest.mark.parametrize("case", MESSAGES_CASES)
def test_a_streamed_message_matches_anthropics_event_schemas(client: TestClient, case: str) -> None:
    events = streamed(client, "/v1/messages", MESSAGES_CASES[case], published.MESSAGES_EVENTS)
    kinds = [data["type"] for _, data in events]
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == ["message_delta", "message_stop"]
    blocks = [(data["type"], data["index"]) for _, data in events if data["type"].startswith("content_block_")]
    starts = [i for kind, i in blocks if kind == "content_block_start"]
    stops = [i for kind, i in blocks if kind == "content_block_stop"]
    assert starts == stops == list(range(len(starts))) and starts  # each block opens, then closes, in order
    if case == "tool use":
        assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
