"""Structured outputs on a real `runner serve` (SmolLM2), driven by the openai SDK with strict
response validation: every reply follows its schema or grammar, whole and streamed, sampled."""

from __future__ import annotations

import json
from collections.abc import Callable

import jsonschema
import openai
import pydantic
import pytest

from server_process import ServerProcess

pytestmark = pytest.mark.model
MODEL = "smollm2-135m-instruct"

SCHEMAS = {
    "nested objects": {"type": "object", "properties": {
        "person": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                                    "address": {"type": "object", "properties": {
                                                        "city": {"type": "string", "maxLength": 30}},
                                                        "required": ["city"], "additionalProperties": False}},
                   "required": ["name", "address"], "additionalProperties": False}},
        "required": ["person"], "additionalProperties": False},
    "enums": {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]},
                                               "size": {"type": "string", "enum": ["S", "M", "L"]}},
              "required": ["colour", "size"], "additionalProperties": False},
    "arrays": {"type": "object", "properties": {"fruits": {"type": "array", "items": {"type": "string", "maxLength": 15},
                                                           "minItems": 2, "maxItems": 4}},
               "required": ["fruits"], "additionalProperties": False},
    "integer bounds": {"type": "object", "properties": {"age": {"type": "integer", "minimum": 18, "maximum": 65},
                                                        "score": {"type": "integer", "minimum": -5, "maximum": 5}},
                       "required": ["age", "score"], "additionalProperties": False},
    "pattern and length": {"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
        "note": {"type": "string", "maxLength": 12}}, "required": ["code", "note"], "additionalProperties": False},
}
ASK = "Reply with a JSON object about a person: their details as asked."


@pytest.fixture(scope="module")
def server(serve_smollm2: Callable[..., ServerProcess]) -> ServerProcess:
    return serve_smollm2("--parallel", "2", "--ctx-size", "1024")


@pytest.fixture(scope="module")
def client(server: ServerProcess):
    with server.openai_client() as c:  # closes its connections at the end of the module
        yield c


def messages(text: str = ASK) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_json_object_replies_parse(client: openai.OpenAI) -> None:
    for seed in range(3):
        r = client.chat.completions.create(model=MODEL, messages=messages("Describe a cat."), seed=seed,
                                           temperature=0.8, max_tokens=120, response_format={"type": "json_object"})
        assert r.choices[0].finish_reason == "stop"
        assert isinstance(json.loads(r.choices[0].message.content), dict)


@pytest.mark.parametrize("case", list(SCHEMAS))
def test_json_schema_replies_validate_whole_and_streamed(client: openai.OpenAI, case: str) -> None:
    schema = SCHEMAS[case]
    fmt = {"type": "json_schema", "json_schema": {"name": case.replace(" ", "_"), "schema": schema, "strict": True}}
    for seed in range(2):
        whole = client.chat.completions.create(model=MODEL, messages=messages(), seed=seed, temperature=0.8,
                                               max_tokens=150, response_format=fmt)
        assert whole.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(whole.choices[0].message.content), schema)
        stream = client.chat.completions.create(model=MODEL, messages=messages(), seed=seed, temperature=0.8,
                                                max_tokens=150, response_format=fmt, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == whole.choices[0].message.content  # same seed: the same reply
        jsonschema.validate(json.loads(text), schema)


class Pet(pydantic.BaseModel):
    name: str
    species: str
    legs: int


def test_the_sdk_parse_helper_returns_the_model(client: openai.OpenAI) -> None:
    r = client.chat.completions.parse(model=MODEL, messages=messages("Invent a pet."), response_format=Pet,
                                      temperature=0, max_tokens=100)
    pet = r.choices[0].message.parsed
    assert isinstance(pet, Pet) and pet.name


def test_a_grammar_extension_constrains_the_reply(server: ServerProcess) -> None:
    r = server.post("/v1/chat/completions", json={"messages": messages("Is the sky green?"), "temperature": 0.8,
                                                  "grammar": 'root ::= ("yes" | "no") "."', "max_tokens": 10})
    assert r.json()["choices"][0]["message"]["content"] in ("yes.", "no.")


@pytest.mark.parametrize(("body", "param"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/nope"}}}},
     "response_format"),
    ({"grammar": "root ::= ("}, "grammar"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wizard"}}}},
     "response_format"),
])
def test_what_cannot_compile_is_a_400_naming_the_field(server: ServerProcess, client: openai.OpenAI, body: dict,
                                                       param: str) -> None:
    r = server.post("/v1/chat/completions", json={"messages": messages(), **body})
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == (param, "invalid_grammar")
    assert client.chat.completions.create(model=MODEL, messages=messages("Hi"), max_tokens=3).choices  # still serving


def _optional_integers(n: int) -> dict:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "many", "schema": {
        "type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)},
        "required": ["p0", "p1", "p2"]}}}}


def test_an_object_of_a_thousand_optional_properties_is_followed(server: ServerProcess) -> None:
    """It was a 500 at the first optional property's comma (llguidance's row limit, 2,000 items)."""
    r = server.post("/v1/chat/completions", json={"messages": messages("Reply with a JSON object."), "temperature": 0,
                                                  "max_tokens": 40, **_optional_integers(1100)})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert (choice["finish_reason"], choice["message"]["content"]) == (
        "length", '{"p0": 123, "p1": 123, "p2": 123, "p3": 123, "p4":')


def test_a_schema_past_the_parsers_limit_fails_mid_reply_in_one_line(server: ServerProcess) -> None:
    """(the message carried kilobytes of llguidance's parser state)"""
    r = server.post("/v1/chat/completions", json={"messages": messages("Reply with a JSON object."), "temperature": 0,
                                                  "max_tokens": 40, **_optional_integers(6000)})
    assert (r.status_code, r.json()) == (500, {"error": {
        "message": "internal error: ConstraintError: the grammar cannot take token 28: Parser Error: Current row has "
                   "11995 items; max is 10000; consider making your grammar left-recursive if it's right-recursive",
        "type": "server_error", "param": None, "code": "generation_failed"}})
