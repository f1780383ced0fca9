"""Request bodies parsed into plain objects, and every way one can be refused (no server needed)."""

from __future__ import annotations

import json

import pytest

from runner.sampling.constraints import GrammarSpec
from runner.server.errors import ApiError
from runner.server.openai_params import parse_chat, parse_completion
from runner.server.request_fields import check_model, parse_json

MSG = [{"role": "user", "content": "Hi"}]

BAD_CHAT = [
    (b"{not json", 400, None, "invalid_json"),
    (b"[1, 2]", 400, None, "invalid_json"),
    ({}, 400, "messages", "missing_required_parameter"),
    ({"messages": []}, 400, "messages", "empty_array"),
    ({"messages": "hi"}, 400, "messages", "invalid_type"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role", "invalid_value"),
    ({"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content", "invalid_type"),
    ({"messages": MSG, "temperature": "hot"}, 400, "temperature", "invalid_type"),
    ({"messages": MSG, "temperature": 7}, 400, "temperature", "invalid_value"),
    ({"messages": MSG, "top_p": -0.5}, 400, "top_p", "invalid_value"),
    ({"messages": MSG, "max_tokens": 0}, 400, "max_tokens", "invalid_value"),
    ({"messages": MSG, "max_tokens": True}, 400, "max_tokens", "invalid_type"),
    ({"messages": MSG, "n": 0}, 400, "n", "invalid_value"),
    ({"messages": MSG, "stop": [1]}, 400, "stop", "invalid_type"),
    ({"messages": MSG, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "invalid_value"),
    ({"messages": MSG, "top_logprobs": 2}, 400, "top_logprobs", "invalid_value"),
    ({"messages": MSG, "stream": "yes"}, 400, "stream", "invalid_type"),
    ({"messages": MSG, "model": "gpt-4o"}, 404, "model", "model_not_found"),
    ({"messages": MSG}, 400, "model", "missing_required_parameter"),  # OpenAI's spec requires it
    (b"[" * 10_000 + b"]" * 10_000, 400, None, "invalid_json"),  # past Python's recursion limit
    (b'{"messages": ' + b"[" * 100 + b"]" * 100 + b"}", 400, None, "invalid_json"),  # past MAX_JSON_DEPTH
    (b'{"messages": [], "seed": ' + b"9" * 5000 + b"}", 400, None, "invalid_json"),  # over 4,300 digits
    (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', 400, None, "invalid_json"),  # lone surrogate
]




@pytest.mark.parametrize(("body", "status", "param", "code"), BAD_CHAT)
def test_bad_chat_input(body: object, status: int, param: str | None, code: str) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(ApiError) as caught:
        params = parse_chat(parse_json(raw))
        check_model(params.common.model, ["smollm2", "my-model"])
    err = caught.value
    assert (err.status, err.param, err.code, err.type) == (status, param, code, "invalid_request_error")
    assert err.message and set(err.body()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(("body", "param"), [({}, "prompt"), ({"prompt": 3}, "prompt"), ({"prompt": []}, "prompt"),
                                             ({"prompt": "x", "logprobs": 9}, "logprobs")])
def test_bad_completion_input(body: dict, param: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_completion(body)
    assert (caught.value.status, caught.value.param) == (400, param)


def test_a_good_chat_body_becomes_plain_params() -> None:
    params = parse_chat({"messages": [{"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
                                      {"role": "user", "content": "Hi"}],
                         "max_completion_tokens": 7, "stop": "x", "temperature": 0, "seed": -1, "logprobs": True,
                         "stream": True, "stream_options": {"include_usage": True}})
    assert [(m.role, m.content) for m in params.messages] == [("system", "be brief"), ("user", "Hi")]
    c = params.common
    assert (c.max_tokens, c.stop, c.stream, c.include_usage, c.n_top_logprobs) == (7, ("x",), True, True, 0)
    assert c.sampling.temperature == 0.0 and c.sampling.seed == 2**64 - 1


def test_a_completion_prompt_may_be_a_text_token_ids_or_a_batch_of_either() -> None:
    assert parse_completion({"prompt": "once"}).prompts == ("once",)
    assert parse_completion({"prompt": [1, 2, 3]}).prompts == ((1, 2, 3),)
    assert parse_completion({"prompt": ["once"]}).prompts == ("once",)
    assert parse_completion({"prompt": ["a", "b", ""]}).prompts == ("a", "b", "")
    assert parse_completion({"prompt": [[1, 2], [3]]}).prompts == ((1, 2), (3,))


@pytest.mark.parametrize("prompt", [["a", [1]], [[1], []], [[1], "a"], [True], [[1, True]], ["a"] * 257, [None]])
def test_a_prompt_batch_of_mixed_kinds_empty_ids_or_too_many_is_refused(prompt: list) -> None:
    with pytest.raises(ApiError) as caught:
        parse_completion({"prompt": prompt})
    assert (caught.value.status, caught.value.param) == (400, "prompt")


@pytest.mark.parametrize(("field", "value"), [
    ("functions", [{"name": "f"}]), ("best_of", 3), ("echo", True), ("suffix", "end"),
])
def test_parameters_not_done_here_are_refused_by_name(field: str, value: object) -> None:
    with pytest.raises(ApiError) as caught:
        parse_chat({"messages": MSG, field: value})
    assert (caught.value.status, caught.value.param, caught.value.code) == (400, field, "unsupported_parameter")


@pytest.mark.parametrize(("field", "value"), [("tools", []), ("tool_choice", "none"), ("logit_bias", {}),
                                              ("response_format", {"type": "text"}), ("parallel_tool_calls", True),
                                              ("echo", False), ("best_of", 1)])
def test_values_that_ask_for_nothing_are_accepted(field: str, value: object) -> None:
    assert parse_chat({"messages": MSG, field: value}).messages[0].content == "Hi"


def test_logit_bias_becomes_sorted_pairs() -> None:
    params = parse_chat({"messages": MSG, "logit_bias": {"50": 5, "7": -100}})
    assert params.common.sampling.logit_bias == ((7, -100.0), (50, 5.0))


@pytest.mark.parametrize("value", [{"a": 1}, {"-3": 1}, {"5": 101}, {"5": "x"}, {"5": -100.5}, [1, 2],
                                   {"\u00b2": 1}, {"\u0663": 1}, {"9" * 5000: 1}])  # (non-ASCII digits; 5,000 of them)
def test_bad_logit_bias_names_the_field(value: object) -> None:
    with pytest.raises(ApiError) as caught:
        parse_chat({"messages": MSG, "logit_bias": value})
    assert (caught.value.status, caught.value.param) == (400, "logit_bias")


def grammar_of(body: dict):
    return parse_chat({"messages": MSG, **body}).common.grammar


def test_response_format_and_grammar_become_a_grammar_spec() -> None:
    assert grammar_of({}) is None and grammar_of({"response_format": {"type": "text"}}) is None
    assert grammar_of({"response_format": {"type": "json_object"}}) == GrammarSpec("json_object", "", "response_format")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert grammar_of({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema,
                                                                                  "strict": True}}}) == \
        GrammarSpec("json_schema", json.dumps(schema), "response_format")
    assert grammar_of({"response_format": {"type": "json_object", "schema": schema}}).kind == "json_schema"
    assert grammar_of({"grammar": 'root ::= "yes" | "no"'}) == GrammarSpec("gbnf", 'root ::= "yes" | "no"', "grammar")
    assert grammar_of({"json_schema": schema}).param == "json_schema"


@pytest.mark.parametrize(("body", "param"), [
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": "json"}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}}, "response_format"),
    ({"grammar": 5}, "grammar"),
    ({"grammar": "root ::= x", "response_format": {"type": "json_object"}}, "grammar"),
])
def test_bad_response_formats_name_the_field(body: dict, param: str) -> None:
    with pytest.raises(ApiError) as caught:
        grammar_of(body)
    assert (caught.value.status, caught.value.param) == (400, param)


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def test_tools_and_tool_messages_become_plain_params() -> None:
    params = parse_chat({"messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
        "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False})
    assert [t.name for t in params.tools] == ["get_weather"] and params.tool_choice == "get_weather"
    assert params.parallel_tool_calls is False
    assert params.messages[1].tool_calls[0].arguments == '{"city": "Oslo"}'
    assert params.messages[2].tool_call_id == "call_1"
    assert parse_chat({"messages": MSG, "tools": [TOOL]}).tool_choice == "auto"
    assert parse_chat({"messages": MSG}).tool_choice == "none"


@pytest.mark.parametrize(("body", "param"), [
    ({"tools": "get_weather"}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
    ({"tools": [TOOL, TOOL]}, "tools"),
    ({"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": "required", "grammar": 'root ::= "a"'}, "tools"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
])
def test_bad_tools_name_the_field(body: dict, param: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_chat({"messages": MSG, **body})
    assert (caught.value.status, caught.value.param) == (400, param)


def test_a_grammar_beside_tools_names_the_field_given_and_a_json_format_goes_with_them() -> None:
    """(a response_format beside tools was refused: it is the reply's shape when no call is made)"""
    with pytest.raises(ApiError) as caught:
        parse_chat({"messages": MSG, "tools": [TOOL], "grammar": 'root ::= "a"'})
    assert (caught.value.status, caught.value.message) == (400, "give grammar or tools, not both")
    for field, value in (("response_format", {"type": "json_object"}), ("json_schema", {"type": "object"})):
        params = parse_chat({"messages": MSG, "tools": [TOOL], field: value})
        assert params.common.grammar is not None and params.common.grammar.param == field and params.tools


def test_parallel_tool_calls_null_is_not_given() -> None:
    """(null was a 400, though every other optional field takes it as not given)"""
    assert parse_chat({"messages": MSG, "tools": [TOOL], "parallel_tool_calls": None}).parallel_tool_calls is True
