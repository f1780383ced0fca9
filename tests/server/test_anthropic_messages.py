"""Anthropic's Messages API on a real `runner serve` (SmolLM2), driven by the anthropic SDK; and its
parsing into the one internal chat request, without a server."""

from __future__ import annotations

import json
from collections.abc import Callable

import anthropic
import httpx
import pytest

from runner.server.anthropic_messages import parse_messages
from runner.server.errors import ApiError
from server_process import ServerProcess

MODEL = "smollm2-135m-instruct"
GREEDY = {"extra_body": {"temperature": 0}}  # this SDK version takes no sampling arguments of its own
WEATHER = {"name": "get_weather", "description": "Get the weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                            "required": ["city"], "additionalProperties": False}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_a_body_becomes_the_internal_chat_request() -> None:
    params = parse_messages({
        "model": MODEL, "max_tokens": 9, "system": [{"type": "text", "text": "Be brief."}], "stop_sequences": ["##"],
        "temperature": 0.5, "top_k": 5, "tools": [WEATHER], "tool_choice": {"type": "any"},
        "messages": [*ASK, {"role": "assistant", "content": [
                         {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sun"}]}]})
    assert [(m.role, m.content) for m in params.messages] == [
        ("system", "Be brief."), ("user", "What is the weather in Paris?"), ("assistant", ""), ("tool", "sun")]
    assert params.messages[2].tool_calls[0].arguments == '{"city": "Paris"}'
    assert params.messages[3].tool_call_id == "toolu_1"
    assert (params.common.max_tokens, params.common.stop, params.tool_choice) == (9, ("##",), "required")
    assert (params.common.sampling.temperature, params.common.sampling.top_k) == (0.5, 5)
    failed = parse_messages({"model": MODEL, "max_tokens": 9, "messages": [*ASK, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "city unknown", "is_error": True}]}]})
    assert failed.messages[-1].content == "Error: city unknown"  # (it read as a result)


@pytest.mark.parametrize(("fields", "shown", "budget"), [
    ({}, False, None),
    ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, True, 2048),
    ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "medium"}}, True, 4096),
    ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}}, True, None),
    ({"thinking": {"type": "disabled"}, "output_config": {"effort": "low"}}, False, 0),
])
def test_thinking_and_effort_become_whether_it_is_shown_and_its_budget(fields: dict, shown: bool,
                                                                       budget: int | None) -> None:
    params = parse_messages({"max_tokens": 5, "messages": ASK, **fields})
    assert (params.show_thinking, params.thinking_budget) == (shown, budget)


def test_with_every_tool_left_out_auto_means_no_tools() -> None:
    params = parse_messages({"max_tokens": 5, "messages": ASK, "tool_choice": {"type": "auto"},
                             "tools": [{"type": "web_search_20250305", "name": "web_search"}]})
    assert (params.tools, params.tool_choice, params.ignored_tools) == ((), "none", ("web_search",))
    with pytest.raises(ApiError):  # but a call it requires cannot be made
        parse_messages({"max_tokens": 5, "messages": ASK, "tool_choice": {"type": "any"},
                        "tools": [{"type": "web_search_20250305", "name": "web_search"}]})


PET = {"type": "object", "properties": {"name": {"type": "string"}, "legs": {"type": "integer"}},
       "required": ["name", "legs"]}
AS_PET = {"type": "json_schema", "schema": PET}


@pytest.mark.parametrize("fields", [{"output_format": AS_PET}, {"output_format": AS_PET,
                                                                "output_config": {"format": AS_PET}}])
def test_the_betas_output_format_is_read_as_output_config_format(fields: dict) -> None:
    """(the structured-outputs beta's top-level field was ignored: free text)"""
    grammar = parse_messages({"max_tokens": 5, "messages": ASK, **fields}).common.grammar
    assert grammar is not None and (grammar.kind, json.loads(grammar.source)) == ("json_schema", PET)


@pytest.mark.parametrize(("fields", "message", "param"), [
    ({"output_format": AS_PET, "output_config": {"format": {**AS_PET, "schema": {"type": "object"}}}},
     "output_format and output_config.format differ: give one of them", "output_format"),
    ({"output_format": {"type": "json_object"}}, 'output_format must be {"type": "json_schema", "schema": {...}}',
     "output_format"),
])
def test_a_format_beside_a_different_one_is_refused(fields: dict, message: str, param: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_messages({"max_tokens": 5, "messages": ASK, **fields})
    assert (caught.value.status, caught.value.message, caught.value.param) == (400, message, param)


def test_a_format_beside_tools_holds() -> None:
    """(it was a 400 unless tool_choice was none: the format is the reply's shape when no call is made)"""
    for choice in ({"type": "none"}, {"type": "auto"}, {"type": "any"}):
        params = parse_messages({"max_tokens": 5, "messages": ASK, "output_config": {"format": AS_PET},
                                 "tools": [WEATHER], "tool_choice": choice})
        assert params.common.grammar is not None and params.common.grammar.param == "output_config.format"


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": ASK}, "max_tokens"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages.0.content.0"),
    ({"max_tokens": 5, "messages": ASK, "tools": [{"description": "no name"}]}, "tools.0.name"),
    ({"max_tokens": 5, "messages": ASK, "tool_choice": {"type": "sometimes"}, "tools": [WEATHER]}, "tool_choice"),
    ({"max_tokens": 5, "messages": ASK, "tool_choice": {"type": "tool"}, "tools": [WEATHER]}, "tool_choice"),
    ({"max_tokens": 5, "messages": ASK, "tools": ["get_weather"]}, "tools.0.name"),
    ({"max_tokens": 5, "messages": ASK, "thinking": {"type": "enabled"}}, "thinking"),
    ({"max_tokens": 5, "messages": ASK, "thinking": {"type": "sometimes"}}, "thinking"),
    ({"max_tokens": 5, "messages": ASK, "output_config": {"effort": "huge"}}, "output_config"),
    ({"max_tokens": 5, "messages": ASK, "output_config": {"effort": ["low"]}}, "output_config"),
    ({"max_tokens": 5, "messages": ASK, "tool_choice": {"type": "tool", "name": [1]}, "tools": [WEATHER]},
     "tool_choice"),
    ({"max_tokens": 5, "messages": [{"role": "system", "content": "only this"}]}, "messages"),
    ({"max_tokens": 5, "messages": ASK, "tool_choice": {"type": "auto", "disable_parallel_tool_use": "no"},
      "tools": [WEATHER]}, "tool_choice"),
    ({"max_tokens": 5, "messages": ASK, "output_config": {"format": {"type": "xml"}}}, "output_config.format"),
    ({"max_tokens": 5, "messages": ASK, "stop_sequences": "END"}, "stop_sequences"),
    ({"max_tokens": 5, "messages": ASK, "stop_sequences": [str(i) for i in range(65)]}, "stop_sequences"),
    ({"max_tokens": 5, "messages": ASK, "stop_sequences": ["x" * 1001]}, "stop_sequences"),
])
def test_bad_bodies_are_refused_naming_the_field(body: dict, param: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_messages(body)
    assert (caught.value.status, caught.value.param) == (400, param)


@pytest.fixture(scope="module")
def server(serve_smollm2: Callable[..., ServerProcess]) -> ServerProcess:
    return serve_smollm2("--parallel", "2", "--ctx-size", "2048", "--api-key", "s3cret")


@pytest.fixture(scope="module")
def client(server: ServerProcess):
    with anthropic.Anthropic(base_url=server.url, api_key="s3cret", max_retries=0) as c:  # closes its connections
        yield c


@pytest.mark.model
def test_a_prefilled_reply_is_continued(client: anthropic.Anthropic) -> None:
    """The last message the assistant's: the reply is its continuation (it started over: '1, 2, 3, 4, 5')."""
    reply = client.messages.create(model=MODEL, max_tokens=12, **GREEDY, messages=[
        {"role": "user", "content": "Count to five."}, {"role": "assistant", "content": "1, 2,"}])
    assert reply.content[0].text == " 3, 4, 5."


@pytest.mark.model
@pytest.mark.parametrize("fields", [{"output_config": {"format": AS_PET}}, {"output_format": AS_PET}])
def test_structured_output_follows_output_config_format(client: anthropic.Anthropic, fields: dict) -> None:
    """(it was ignored: free text, and the SDK's messages.parse failed on it; the beta's output_format too)"""
    reply = client.messages.create(model=MODEL, max_tokens=60, messages=[{"role": "user", "content": "Invent a pet."}],
                                   extra_body={"temperature": 0, **fields})
    assert reply.stop_reason == "end_turn" and set(json.loads(reply.content[0].text)) == {"name", "legs"}


@pytest.mark.model
def test_a_format_beside_tools_shapes_a_reply_that_calls_none(client: anthropic.Anthropic) -> None:
    """(a 400 before: 'give output_config.format or tools, not both')"""
    import jsonschema

    for ask, choice in (([{"role": "user", "content": "Invent a pet."}], {"type": "auto"}), (ASK, {"type": "any"})):
        reply = client.messages.create(model=MODEL, max_tokens=80, messages=ask, tools=[WEATHER], tool_choice=choice,
                                       extra_body={"temperature": 0, "output_config": {"format": AS_PET}})
        if reply.stop_reason == "tool_use":
            (call,) = [b for b in reply.content if b.type == "tool_use"]
            jsonschema.validate(call.input, WEATHER["input_schema"])
        else:
            assert choice == {"type": "auto"} and reply.stop_reason == "end_turn"
            jsonschema.validate(json.loads(reply.content[0].text), PET)


@pytest.mark.model
def test_a_prompt_too_long_is_worded_as_anthropic_words_it(client: anthropic.Anthropic) -> None:
    """Claude Code reads 'prompt is too long: N tokens > M maximum' to compact its conversation (it was
    'the prompt has N tokens but ...')."""
    import re

    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "sea " * 3000}])
    message = refused.value.body["error"]["message"]
    assert re.fullmatch(r"prompt is too long: (\d+) tokens > 2047 maximum \(the prompt has \1 tokens but .*\)", message)
    assert int(re.match(r"prompt is too long: (\d+)", message).group(1)) > 3000
    with pytest.raises(anthropic.BadRequestError) as before_tokenizing:  # (refused by its characters alone)
        client.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "sea " * 200_000}])
    assert re.match(r"prompt is too long: \d+ tokens > 2047 maximum \(the prompt has 800000 characters",
                    before_tokenizing.value.body["error"]["message"])


@pytest.mark.model
def test_a_text_reply_whole_and_streamed(client: anthropic.Anthropic) -> None:
    whole = client.messages.create(model=MODEL, max_tokens=30, messages=[{"role": "user", "content": "Say hi"}],
                                   **GREEDY)
    assert whole.id.startswith("msg_") and whole.role == "assistant" and whole.stop_reason == "end_turn"
    assert whole.content[0].type == "text" and whole.content[0].text
    assert whole.usage.input_tokens > 0 and whole.usage.output_tokens > 0
    with client.messages.stream(model=MODEL, max_tokens=30, messages=[{"role": "user", "content": "Say hi"}],
                                **GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text and final.stop_reason == "end_turn"


@pytest.mark.model
def test_max_tokens_and_stop_sequences_end_the_reply(client: anthropic.Anthropic) -> None:
    cut = client.messages.create(model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "Tell a story."}],
                                 **GREEDY)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    counting = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
    stopped = client.messages.create(model=MODEL, max_tokens=60, messages=counting, stop_sequences=["4"], **GREEDY)
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "4")
    assert "4" not in stopped.content[0].text


@pytest.mark.model
def test_a_tool_use_round_trip(client: anthropic.Anthropic) -> None:
    used = client.messages.create(model=MODEL, max_tokens=100, tools=[WEATHER], tool_choice={"type": "any"},
                                  messages=ASK, **GREEDY)
    assert used.stop_reason == "tool_use"
    (block,) = [b for b in used.content if b.type == "tool_use"]
    assert block.id.startswith("toolu_") and block.name == "get_weather" and isinstance(block.input["city"], str)
    with client.messages.stream(model=MODEL, max_tokens=100, tools=[WEATHER],
                                tool_choice={"type": "tool", "name": "get_weather"}, messages=ASK, **GREEDY) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "tool_use" and streamed.content[-1].input == block.input
    follow = client.messages.create(model=MODEL, max_tokens=30, tools=[WEATHER], tool_choice={"type": "none"},
                                    messages=[*ASK, {"role": "assistant", "content": [block.model_dump()]},
                                              {"role": "user", "content": [{"type": "tool_result",
                                                                            "tool_use_id": block.id,
                                                                            "content": "Sunny, 21 C"}]}], **GREEDY)
    assert follow.content[0].type == "text" and follow.content[0].text


@pytest.mark.model
def test_count_tokens_and_errors_in_anthropics_envelope(server: ServerProcess, client: anthropic.Anthropic) -> None:
    counted = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "Say hi"}])
    whole = client.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "Say hi"}])
    assert counted.input_tokens == whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    again = client.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "Say hi"}])
    # Anthropic's input_tokens leaves cache reads out: the sum is the prompt (it was counted twice)
    assert again.usage.cache_read_input_tokens > 0
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == counted.input_tokens
    r = httpx.post(server.url + "/v1/messages", headers={"x-api-key": "s3cret"}, timeout=30,
                   json={"model": MODEL, "messages": ASK})
    assert r.status_code == 400
    assert r.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                   "message": "max_tokens: Field required"}}
    with anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0) as wrong:
        with pytest.raises(anthropic.AuthenticationError):
            wrong.messages.create(model=MODEL, max_tokens=2, messages=ASK)
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-sonnet", max_tokens=2, messages=ASK)
    bad_tool = {**WEATHER, "input_schema": {"type": "object", "properties": {"city": {"type": "no-such-type"}}}}
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model=MODEL, max_tokens=20, messages=ASK, tools=[bad_tool], tool_choice={"type": "any"})
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert "no-such-type" in caught.value.body["error"]["message"]


def test_text_beside_tools_streams_before_the_reply_ends_then_the_calls() -> None:
    """(With tools offered, every delta waited for the whole reply: Claude Code showed nothing until then.)"""
    from runner.prompt.tools import HERMES, Tool, ToolReading
    from runner.scheduler.request import FinishReason, StreamEvent, Usage
    from runner.server.anthropic_messages import MessageBuilder

    reading = ToolReading(HERMES, (Tool("get_weather", "", {"type": "object"}),))
    builder = MessageBuilder("msg-1", MODEL, 5, (), None, reading)
    pieces = ["It is", " sunny?", " Let me", " check.\n", "<tool_call>", '{"name": "get_weather", ',
              '"arguments": {"city": "Paris"}}</tool_call>']
    sent = [builder.chunk_sse(StreamEvent("msg-1", text, finish_reason=FinishReason.STOP if i == len(pieces) - 1 else None,
                                          usage=Usage(5, 7) if i == len(pieces) - 1 else None)) or ""
            for i, text in enumerate(pieces)]
    sent.append(builder.stream_end(False))
    events = [json.loads(line.removeprefix("data: ")) for part in sent for line in part.splitlines()
              if line.startswith("data: ")]
    assert [e["delta"]["text"] for e in events if e["type"] == "content_block_delta"
            and e["delta"]["type"] == "text_delta"] == ["It is", " sunny?", " Let me", " check."]
    assert sent[0] and sent[3] and not sent[4]  # (the text as it came; what may begin a call, held)
    kinds = [(e["type"], e.get("index")) for e in events]
    assert kinds[-6:] == [("content_block_stop", 0), ("content_block_start", 1), ("content_block_delta", 1),
                          ("content_block_stop", 1), ("message_delta", None), ("message_stop", None)]
    assert events[-5]["content_block"]["name"] == "get_weather"
    assert json.loads(events[-4]["delta"]["partial_json"]) == {"city": "Paris"}
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


def test_a_reply_cut_by_the_slots_end_says_the_window_was_exceeded(tiny_gguf) -> None:
    """(it said max_tokens, which Claude Code takes as its own cap and asks the reply to go on, into a
    prompt too long for the slot)"""
    from engines import in_process_server, load_tiny

    with in_process_server(load_tiny(tiny_gguf, 1, ctx_size=64)) as client:
        def stop_reason(max_tokens: int) -> str:
            r = client.post("/v1/messages", json={"model": "tiny", "max_tokens": max_tokens, "temperature": 0,
                                                  "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200, r.text
            return r.json()["stop_reason"]

        assert stop_reason(1000) == "model_context_window_exceeded"
        assert stop_reason(5) == "max_tokens"


def test_max_tokens_0_reads_the_prompt_into_the_cache_and_writes_nothing(tiny_gguf) -> None:
    """Anthropic's way to warm the cache (it was a 400: 'max_tokens' must be at least 1)."""
    from engines import in_process_server, load_tiny

    ask = [{"role": "user", "content": "a long system of things to remember " * 3}]
    with in_process_server(load_tiny(tiny_gguf, 1, ctx_size=128)) as client:
        warm = client.post("/v1/messages", json={"model": "tiny", "max_tokens": 0, "messages": ask})
        assert warm.status_code == 200, warm.text
        body = warm.json()
        assert (body["content"], body["stop_reason"], body["usage"]["output_tokens"]) == (
            [{"type": "text", "text": "", "citations": None}], "max_tokens", 0)
        n_prompt = body["usage"]["input_tokens"]
        again = client.post("/v1/messages", json={"model": "tiny", "max_tokens": 4, "messages": ask}).json()
        assert again["usage"]["cache_read_input_tokens"] >= n_prompt - 1  # (the prompt was read, and kept)
        streamed = client.post("/v1/messages", json={"model": "tiny", "max_tokens": 0, "messages": ask, "stream": True})
        events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: ")]
        assert [e["type"] for e in events][-2:] == ["message_delta", "message_stop"]
        assert events[-2]["delta"]["stop_reason"] == "max_tokens" and events[-2]["usage"]["output_tokens"] == 0
