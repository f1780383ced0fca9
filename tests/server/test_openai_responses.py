"""OpenAI's Responses API on a real `runner serve` (SmolLM2), driven by the openai SDK (strict
validation) and the OpenAI Agents SDK; and its parsing into the one internal chat request."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import agents
import openai
import pydantic
import pytest

from runner.scheduler.request import FinishReason, StreamEvent, Usage
from runner.server.errors import ApiError
from runner.server.openai_responses import ResponsesBuilder, echoed, parse_request
from runner.server.reasoning import ReasoningSplitter
from server_process import ServerProcess

MODEL = "smollm2-135m-instruct"
WEATHER = {"type": "function", "name": "get_weather", "description": "Get the weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                          "required": ["city"], "additionalProperties": False}}
ASK = "What is the weather in Paris?"
KEY = "s3cret"


def test_a_body_becomes_the_internal_chat_request() -> None:
    params = parse_request({
        "model": MODEL, "instructions": "Be brief.", "max_output_tokens": 9, "temperature": 0.5, "top_p": 0.9,
        "tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_weather"}, "parallel_tool_calls": False,
        "store": False, "include": ["reasoning.encrypted_content"],
        "input": [{"role": "user", "content": [{"type": "input_text", "text": ASK}]},
                  {"type": "reasoning", "id": "rs_1", "summary": []},
                  {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me see.",
                                                                         "annotations": []}]},
                  {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
                  {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city":"Nice"}'},
                  {"type": "function_call_output", "call_id": "call_1", "output": "sun"},
                  {"type": "function_call_output", "call_id": "call_2",
                   "output": [{"type": "input_text", "text": "rain"}]}]})
    assert [(m.role, m.content) for m in params.messages] == [
        ("system", "Be brief."), ("user", ASK), ("assistant", "Let me see."), ("tool", "sun"), ("tool", "rain")]
    assert [(c.id, c.arguments) for c in params.messages[2].tool_calls] == [
        ("call_1", '{"city":"Paris"}'), ("call_2", '{"city":"Nice"}')]
    assert [m.tool_call_id for m in params.messages[3:]] == ["call_1", "call_2"]
    assert (params.common.max_tokens, params.tool_choice, params.parallel_tool_calls) == (9, "get_weather", False)
    assert (params.common.sampling.temperature, params.common.sampling.top_p) == (0.5, 0.9)
    left_out = parse_request({"input": "hi", "tools": [{"type": "web_search"}], "tool_choice": "auto"})
    assert (left_out.tools, left_out.tool_choice, left_out.ignored_tools) == ((), "none", ("web_search",))
    budgets = {effort: parse_request({"input": "hi", "reasoning": {"effort": effort}}).thinking_budget
               for effort in ("minimal", "low", "medium", "high")}
    assert budgets == {"minimal": 0, "low": 1024, "medium": 4096, "high": None}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = parse_request({"input": "hi", "text": {"format": {"type": "json_schema", "name": "A", "schema": schema}}})
    assert fmt.common.grammar is not None
    assert (fmt.common.grammar.kind, json.loads(fmt.common.grammar.source), fmt.common.grammar.param) == (
        "json_schema", schema, "text.format")


@pytest.mark.parametrize(("body", "param"), [
    ({}, "input"),
    ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "hi", "store": True}, "store"),
    ({"input": "hi", "include": ["message.output_text.logprobs"]}, "include"),
    ({"input": "hi", "include": [{"a": 1}]}, "include"),
    ({"input": "hi", "metadata": ["a"]}, "metadata"),
    ({"input": "hi", "reasoning": {"effort": "huge"}}, "reasoning.effort"),
    ({"input": "hi", "reasoning": {"summary": "long"}}, "reasoning.summary"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
    ({"input": "hi", "tools": ["web_search"]}, "tools[0]"),
    ({"input": "hi", "tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}}, "tool_choice"),
    ({"input": "hi", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "other"}}, "tool_choice"),
    ({"input": "hi", "tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"input": "hi", "text": {"format": {"type": "xml"}}}, "text.format"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
])
def test_bad_bodies_are_refused_naming_the_field(body: dict, param: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_request(body)
    assert (caught.value.status, caught.value.param) == (400, param)


@pytest.fixture(scope="module")
def server(serve_smollm2: Callable[..., ServerProcess]) -> ServerProcess:
    return serve_smollm2("--parallel", "2", "--ctx-size", "2048", "--api-key", KEY)


@pytest.fixture(scope="module")
def client(server: ServerProcess):
    with server.openai_client(KEY) as c:
        yield c


@pytest.mark.model
def test_a_text_reply_whole_and_streamed(client: openai.OpenAI) -> None:
    whole = client.responses.create(model=MODEL, input="Say hi", temperature=0, max_output_tokens=30)
    assert whole.id.startswith("resp_") and whole.status == "completed" and whole.output_text
    (message,) = whole.output
    assert message.type == "message" and message.id.startswith("msg_") and message.status == "completed"
    assert whole.usage is not None and whole.usage.input_tokens > 0
    assert whole.usage.total_tokens == whole.usage.input_tokens + whole.usage.output_tokens
    with client.responses.stream(model=MODEL, input="Say hi", temperature=0, max_output_tokens=30) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert final.output_text == whole.output_text and final.usage is not None
    assert (final.usage.input_tokens, final.usage.output_tokens) == (whole.usage.input_tokens, whole.usage.output_tokens)
    assert final.usage.input_tokens_details.cached_tokens > 0  # the same prompt again: its prefix was kept


@pytest.mark.model
def test_max_output_tokens_makes_it_incomplete(client: openai.OpenAI) -> None:
    cut = client.responses.create(model=MODEL, input="Tell a story.", temperature=0, max_output_tokens=3)
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage is not None and cut.usage.output_tokens == 3 and cut.output[0].status == "incomplete"


class City(pydantic.BaseModel):
    name: str
    country: str


@pytest.mark.model
def test_parse_follows_the_schema(client: openai.OpenAI) -> None:
    parsed = client.responses.parse(model=MODEL, input="Name a city in France.", text_format=City, temperature=0,
                                    max_output_tokens=60)
    assert isinstance(parsed.output_parsed, City) and parsed.output_parsed.name


@pytest.mark.model
def test_a_function_call_round_trip_whole_and_streamed(client: openai.OpenAI) -> None:
    used = client.responses.create(model=MODEL, input=ASK, tools=[WEATHER], tool_choice="required", temperature=0,
                                   max_output_tokens=100)
    (call,) = used.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert isinstance(json.loads(call.arguments)["city"], str)
    with client.responses.stream(model=MODEL, input=ASK, tools=[WEATHER], temperature=0, max_output_tokens=100,
                                 tool_choice={"type": "function", "name": "get_weather"}) as stream:
        kinds = [e.type for e in stream]
        streamed = stream.get_final_response()
    assert kinds[2:6] == ["response.output_item.added", "response.function_call_arguments.delta",
                          "response.function_call_arguments.done", "response.output_item.done"]
    assert streamed.output[-1].type == "function_call" and streamed.output[-1].arguments == call.arguments
    follow = client.responses.create(
        model=MODEL, tools=[WEATHER], temperature=0, max_output_tokens=30,
        input=[{"role": "user", "content": ASK}, call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}])
    assert follow.output[0].type == "message" and follow.output_text


@pytest.mark.model
def test_errors_in_openais_envelope(server: ServerProcess, client: openai.OpenAI) -> None:
    auth = {"authorization": f"Bearer {KEY}"}
    r = server.post("/v1/responses", json={"input": "hi", "previous_response_id": "resp_1"}, headers=auth)
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["param"], error["code"]) == ("previous_response_id", "unsupported_parameter")
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="gpt-5", input="hi")
    r = server.post("/v1/responses", content=b"{", headers={**auth, "content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    bad_tool = {**WEATHER, "parameters": {"type": "object", "properties": {"city": {"type": "no-such-type"}}}}
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input=ASK, tools=[bad_tool], tool_choice="required")
    assert caught.value.body["param"] == "tools"
    with server.openai_client("wrong") as wrong, pytest.raises(openai.AuthenticationError):
        wrong.responses.create(model=MODEL, input="hi")


@pytest.mark.model
def test_an_agents_sdk_agent_calls_its_tool_and_answers(server: ServerProcess) -> None:
    agents.set_tracing_disabled(True)
    cities: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Get the weather in a city."""
        cities.append(city)
        return f"Sunny, 21 C in {city}"

    async def run() -> tuple[object, object]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0,
                                    _strict_response_validation=True)
        model = agents.OpenAIResponsesModel(model=MODEL, openai_client=client)
        agent = agents.Agent(name="weather", instructions="Answer using the tools.", tools=[get_weather], model=model,
                             model_settings=agents.ModelSettings(temperature=0, tool_choice="required", max_tokens=80))
        whole = await agents.Runner.run(agent, ASK)
        streamed = agents.Runner.run_streamed(agent, "What is the weather in Rome?")
        async for _ in streamed.stream_events():
            pass
        await client.close()
        return whole, streamed

    whole, streamed = asyncio.run(run())
    assert cities == ["Paris", "Rome"]
    kinds = [type(item).__name__ for item in whole.new_items]
    assert kinds == ["ToolCallItem", "ToolCallOutputItem", "MessageOutputItem"]
    assert isinstance(whole.final_output, str) and whole.final_output
    assert isinstance(streamed.final_output, str) and streamed.final_output


def _streamed(builder: ResponsesBuilder, pieces: list[str]) -> list[dict]:
    """The builder's stream for these pieces of reply, as the parsed events."""
    usage = Usage(prompt_tokens=5, completion_tokens=len(pieces))
    sse = builder.stream_start()
    for i, text in enumerate(pieces):
        final = i == len(pieces) - 1
        sse += builder.chunk_sse(StreamEvent("resp-1", text, finish_reason=FinishReason.STOP if final else None,
                                             usage=usage if final else None)) or ""
    sse += builder.stream_end(False)
    return [json.loads(line.removeprefix("data: ")) for line in sse.splitlines() if line.startswith("data: ")]


def test_reasoning_streams_as_its_own_item_before_the_message() -> None:
    params = parse_request({"input": "hi"})
    builder = ResponsesBuilder("resp-1", MODEL, 5, echoed({"input": "hi"}, params), ReasoningSplitter(), None)
    events = _streamed(builder, ["<think>Hm", "m.</th", "ink>\n\nHel", "lo"])
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["reasoning", "message"]
    assert final["output"][0]["content"] == [{"type": "reasoning_text", "text": "Hmm."}]
    assert final["output"][1]["content"][0]["text"] == "Hello"
    assert final["output"][1]["status"] == "completed"
    # the whole reply reads the same items
    whole = ResponsesBuilder("resp-1", MODEL, 5, echoed({"input": "hi"}, params), ReasoningSplitter(), None)
    whole.add(StreamEvent("resp-1", "<think>Hmm.</think>\n\nHello", finish_reason=FinishReason.STOP, usage=Usage(5, 1)))
    body = whole.whole()
    assert [(i["type"], i["content"][0]["text"]) for i in body["output"]] == [("reasoning", "Hmm."),
                                                                               ("message", "Hello")]
    assert body["usage"]["total_tokens"] == 6 and body["status"] == "completed"


def test_an_empty_reply_still_streams_its_message() -> None:
    params = parse_request({"input": "hi"})
    builder = ResponsesBuilder("resp-1", MODEL, 5, echoed({"input": "hi"}, params), None, None)
    events = _streamed(builder, [""])
    assert [e["type"] for e in events][2:] == [
        "response.output_item.added", "response.content_part.added", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == ""


def test_text_beside_tools_streams_before_the_reply_ends_then_the_calls() -> None:
    """(With tools offered, every delta waited for the whole reply: Codex showed nothing until then.)"""
    from runner.prompt.tools import HERMES, Tool, ToolReading

    params = parse_request({"input": "hi"})
    reading = ToolReading(HERMES, (Tool("add", "", {"type": "object"}),))
    builder = ResponsesBuilder("resp-1", MODEL, 5, echoed({"input": "hi"}, params), None, reading)
    events = _streamed(builder, ["\nLet", " me", " add.", "\n<tool", '_call>{"name": "add", "arguments": {"a": 1}}',
                                 "</tool_call>"])
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert deltas == ["Let", " me", " add."]
    assert [e["type"] for e in events][-5:] == [
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    output = events[-1]["response"]["output"]
    assert [item["type"] for item in output] == ["message", "function_call"]
    assert output[0]["content"][0]["text"] == "Let me add." and output[1]["arguments"] == '{"a": 1}'
