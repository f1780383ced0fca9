"""Tool calls on a real `runner serve` (SmolLM2: its template knows no tools, so the documented
fallback format), driven by the openai SDK with strict response validation."""

from __future__ import annotations

import json
from collections.abc import Callable

import jsonschema
import openai
import pytest

from server_process import ServerProcess

pytestmark = pytest.mark.model
MODEL = "smollm2-135m-instruct"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(serve_smollm2: Callable[..., ServerProcess]) -> ServerProcess:
    return serve_smollm2("--parallel", "2", "--ctx-size", "2048")


@pytest.fixture(scope="module")
def client(server: ServerProcess):
    with server.openai_client() as c:  # closes its connections at the end of the module
        yield c


def schema_of(name: str) -> dict:
    return {"get_weather": WEATHER, "add": ADD}[name]["function"]["parameters"]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_a_required_or_named_call_comes_back_as_tool_calls(client: openai.OpenAI, choice) -> None:
    for seed in range(2):
        r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, ADD], tool_choice=choice,
                                           temperature=0.8, seed=seed, max_tokens=120, parallel_tool_calls=False)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and c.message.content is None
        (call,) = c.message.tool_calls
        assert call.id.startswith("call_") and call.type == "function"
        assert call.function.name == ("add" if isinstance(choice, dict) else call.function.name)
        jsonschema.validate(json.loads(call.function.arguments), schema_of(call.function.name))


def test_tool_choice_none_and_auto_answer_validly(client: openai.OpenAI) -> None:
    none = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="none",
                                          temperature=0, max_tokens=30)
    assert none.choices[0].message.content and not none.choices[0].message.tool_calls
    auto = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=60)
    message = auto.choices[0].message
    assert message.content or message.tool_calls  # the model chooses; the reply is well formed either way


def test_a_streamed_call_arrives_as_indexed_fragments(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
                                            temperature=0, max_tokens=120, stream=True)
    fragments = [tc for chunk in stream if chunk.choices for tc in (chunk.choices[0].delta.tool_calls or [])]
    assert fragments[0].index == 0 and fragments[0].id.startswith("call_") and fragments[0].type == "function"
    assert fragments[0].function.name == "get_weather"
    assert all(f.id is None and f.function.name is None for f in fragments[1:])
    arguments = "".join(f.function.arguments or "" for f in fragments)
    jsonschema.validate(json.loads(arguments), schema_of("get_weather"))


def test_a_follow_up_turn_with_the_tools_result(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
                                           temperature=0, max_tokens=120)
    call = first.choices[0].message.tool_calls[0]
    turn = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "clear"})}]
    reply = client.chat.completions.create(model=MODEL, messages=turn, tools=[WEATHER], tool_choice="none",
                                           temperature=0, max_tokens=40)
    assert reply.choices[0].finish_reason in ("stop", "length") and reply.choices[0].message.content


@pytest.mark.parametrize(("body", "param"), [
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "fly"}}}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {}}}, "tool_choice"),  # (not "auto")
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "wizard"}}}],
      "tool_choice": "required"}, "tools"),
])
def test_bad_tools_are_a_400_naming_the_field(server: ServerProcess, body: dict, param: str) -> None:
    r = server.post("/v1/chat/completions", json={"messages": ASK, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_instructor_gets_its_model_back_through_tool_calls(server: ServerProcess) -> None:
    import instructor
    import pydantic

    class City(pydantic.BaseModel):
        name: str
        country: str

    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as raw:
        client = instructor.from_openai(raw, mode=instructor.Mode.TOOLS)
        city = client.chat.completions.create(model=MODEL, response_model=City, max_retries=0, temperature=0,
                                              max_tokens=80, messages=[{"role": "user", "content": "Name a city."}])
    assert isinstance(city, City) and city.name and city.country
