"""Ollama's request bodies read into the internal request, and its NDJSON replies written back:
no model needed."""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pytest

from runner.scheduler.request import FinishReason, StreamEvent, Usage
from runner.server.errors import ApiError
from runner.server.ollama_api import (OllamaBuilder, embed_dimensions, parse_chat, parse_generate, shortened,
                                      truncated_ids)
from runner.server.params import ChatParams, CompletionParams
from runner.server.reasoning import ReasoningSplitter

CTX = 2048


def chat(**body: object) -> ChatParams:
    return parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}, CTX)


@pytest.mark.parametrize(("seed", "expected"), [(7, 7), (0, 0), (-1, None), (-1436, None), (None, None)])
def test_a_seed_is_kept_and_a_negative_one_means_random(seed: int | None, expected: int | None) -> None:
    options = {} if seed is None else {"seed": seed}
    assert chat(options=options).common.sampling.seed == expected


def test_options_map_onto_the_sampling_fields() -> None:
    params = chat(options={"temperature": 0, "top_k": 3, "top_p": 0.5, "min_p": 0.1, "repeat_last_n": 8,
                           "repeat_penalty": 1.2, "num_predict": 9, "stop": "END"})
    s = params.common.sampling
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.repeat_last_n, s.repeat_penalty) == (0, 3, 0.5, 0.1, 8, 1.2)
    assert params.common.max_tokens == 9 and params.common.stop == ("END",)
    assert chat(options={"num_predict": -1}).common.max_tokens is None  # Ollama's "no limit"


@pytest.mark.parametrize(("body", "field"), [
    ({"options": {"repeat_last_n": -2}}, "repeat_last_n"),
    ({"options": {"seed": "x"}}, "seed"),
    ({"options": {"num_ctx": CTX + 1}}, "num_ctx"),
    ({"options": []}, "options"),
    ({"think": "very"}, "think"),
    ({"stream": "yes"}, "stream"),
    ({"format": 3}, "format"),
])
def test_bad_fields_are_a_400_naming_them(body: dict, field: str) -> None:
    with pytest.raises(ApiError) as caught:
        chat(**body)
    assert caught.value.status == 400 and field in caught.value.message


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.mark.parametrize("fmt", ["json", {"type": "object", "properties": {"a": {"type": "integer"}}}])
def test_a_format_beside_tools_is_kept(fmt: object) -> None:
    """(it was a 400: the format is the reply's shape when no call is made)"""
    for choice in ({}, {"tool_choice": "none"}):
        kept = chat(format=fmt, tools=[WEATHER], **choice)
        assert kept.common.grammar is not None and kept.common.grammar.param == "format" and kept.tools


def test_generate_is_a_user_turn_with_its_system_or_the_raw_prompt() -> None:
    turned = parse_generate({"model": "m", "prompt": "hi", "system": "be brief"}, CTX)
    assert isinstance(turned, ChatParams)
    assert [(m.role, m.content) for m in turned.messages] == [("system", "be brief"), ("user", "hi")]
    raw = parse_generate({"model": "m", "prompt": "<s>hi", "raw": True}, CTX)
    assert isinstance(raw, CompletionParams) and raw.prompts == ("<s>hi",)


def events(*texts: str) -> list[StreamEvent]:
    out = [StreamEvent("r", t) for t in texts[:-1]]
    return out + [StreamEvent("r", texts[-1], finish_reason=FinishReason.STOP, usage=Usage(5, len(texts)))]


def test_text_beside_tools_streams_before_the_reply_ends_then_the_calls() -> None:
    """(With tools offered, /api/chat sent nothing until the whole reply was in.)"""
    from runner.prompt.tools import HERMES, Tool, ToolReading

    builder = OllamaBuilder("m", 5, True, tools=ToolReading(HERMES, (Tool("add", "", {"type": "object"}),)))
    lines = [builder.chunk_sse(e) for e in events("Adding", " now.", " <tool_call>",
                                                  '{"name": "add", "arguments": {"a": 1}}</tool_call>')]
    assert [json.loads(line)["message"]["content"] for line in lines[:2]] == ["Adding", " now."]
    assert lines[2] is None
    last = json.loads(lines[3])["message"]
    assert (last["content"], last["tool_calls"]) == ("", [{"function": {"name": "add", "arguments": {"a": 1}}}])
    assert json.loads(builder.stream_end(False))["done_reason"] == "stop"


@pytest.mark.parametrize("show_thinking", [True, False])
def test_thinking_is_apart_from_the_content_streamed_and_whole(show_thinking: bool) -> None:
    pieces = ("<think>", "add them", "</think>", "4")
    streamed = OllamaBuilder("m", 5, True, ReasoningSplitter(), show_thinking=show_thinking)
    lines = [streamed.chunk_sse(e) for e in events(*pieces)]
    objects = [json.loads(line) for line in lines if line] + [json.loads(streamed.stream_end(False))]
    thinking = "".join(o["message"].get("thinking", "") for o in objects)
    content = "".join(o["message"]["content"] for o in objects)
    assert (thinking, content) == ("add them" if show_thinking else "", "4")
    assert objects[-1]["done"] and objects[-1]["done_reason"] == "stop" and objects[-1]["eval_count"] == 4

    whole = OllamaBuilder("m", 5, True, ReasoningSplitter(), show_thinking=show_thinking)
    for e in events(*pieces):
        whole.add(e)
    message = whole.whole()["message"]
    assert message["content"] == "4" and message.get("thinking", "") == ("add them" if show_thinking else "")


def test_a_reply_cut_by_its_length_says_so() -> None:
    builder = OllamaBuilder("m", 5, False)
    builder.add(StreamEvent("r", "abc", finish_reason=FinishReason.LENGTH, usage=Usage(5, 3)))
    final = builder.whole()
    assert (final["response"], final["done_reason"], final["prompt_eval_count"], final["eval_count"]) == \
        ("abc", "length", 5, 3)


@pytest.mark.parametrize(("template", "system", "expected"), [
    ("{{ .System }}\n{{ .Prompt }}", "be brief", "be brief\nhi"),
    ("{{ if .System }}<s>{{ .System }}</s>{{ end }}Q: {{ .Prompt }}\nA: {{ .Response }}", "", "Q: hi\nA: "),
    ("{{ if .System }}<s>{{ .System }}</s>{{ else }}<none>{{ end }}{{ .Prompt }}", "x", "<s>x</s>hi"),
    ("{{ if .System }}S{{ else }}<none>{{ end }}{{ .Prompt }}", "", "<none>hi"),
    ("<|user|>\n  {{- .Prompt -}}  \n<|assistant|>", "", "<|user|>hi<|assistant|>"),
])
def test_generate_takes_a_template_in_the_forms_apps_send(template: str, system: str, expected: str) -> None:
    params = parse_generate({"model": "m", "prompt": "hi", "system": system, "template": template}, CTX)
    assert isinstance(params, CompletionParams) and params.prompts == (expected,)


@pytest.mark.parametrize(("template", "message"), [
    ("{{ range .Messages }}{{ .Content }}{{ end }}", "{{ range .Messages }} is not supported here"),
    ("{{ if .System }}{{ .System }}", "has no {{ end }}"),
])
def test_a_template_beyond_those_forms_is_a_400_naming_the_construct(template: str, message: str) -> None:
    with pytest.raises(ApiError) as refused:
        parse_generate({"model": "m", "prompt": "hi", "template": template}, CTX)
    assert refused.value.status == 400 and message in refused.value.message


def test_show_says_an_embedding_model_embeds(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tiny_gguf import write_tiny_gguf

    from runner.runtime.gguf_file import read_gguf
    from runner.server.ollama_models import capabilities

    embedder = read_gguf(write_tiny_gguf(tmp_path / "e.gguf", pooling_type=1))
    chat_model = read_gguf(write_tiny_gguf(tmp_path / "c.gguf"))
    assert capabilities(embedder) == ["embedding"] and capabilities(chat_model)[0] == "completion"


@pytest.mark.parametrize(("option", "read"), [
    ("num_predict", lambda p: p.common.max_tokens),
    ("seed", lambda p: p.common.sampling.seed),
    ("top_k", lambda p: p.common.sampling.top_k),
    ("repeat_last_n", lambda p: p.common.sampling.repeat_last_n),
])
def test_a_whole_number_float_is_an_integer_option_as_ollama_reads_json(option: str,
                                                                        read: Callable[[ChatParams], object]) -> None:
    got = read(chat(options={option: 3.0}))
    assert (got, type(got)) == (3, int)
    params = chat(options={"num_ctx": float(CTX), "temperature": 1.0})  # (a number option stays a float)
    assert (params.common.sampling.temperature, type(params.common.sampling.temperature)) == (1.0, float)


@pytest.mark.parametrize("option", ["num_predict", "seed", "top_k", "num_ctx", "repeat_last_n"])
def test_a_fractional_integer_option_is_still_a_400(option: str) -> None:
    with pytest.raises(ApiError) as caught:
        chat(options={option: 3.5})
    assert (caught.value.status, caught.value.message) == (400, f"'{option}' must be an integer, got 3.5")


def test_prompt_eval_count_is_the_whole_prompt_cached_or_not() -> None:
    """As Ollama counts it (apps track the context's fill by it): not only the tokens computed anew."""
    builder = OllamaBuilder("m", 37, True)
    builder.add(StreamEvent("r", "hi", finish_reason=FinishReason.STOP, usage=Usage(37, 1, cached_tokens=36)))
    assert builder.whole()["prompt_eval_count"] == 37
    assert json.loads(builder.stream_end(False))["prompt_eval_count"] == 37


@pytest.mark.parametrize(("ids", "special_ids", "expected"), [
    ([1, 2, 3], [], [1, 2, 3]),  # fits: as it is
    ([5, 6, 7, 8, 9, 10], [], [5, 6, 7, 8]),  # no special tokens (SmolLM2)
    ([1, 6, 7, 8, 9, 10], [1], [1, 6, 7, 8]),  # a BOS first
    ([6, 7, 8, 9, 10, 2], [2], [6, 7, 8, 2]),  # an EOS last (last-token pooling reads it)
    ([101, 6, 7, 8, 9, 102], [101, 102], [101, 6, 7, 102]),  # BERT's [CLS] ... [SEP]
])
def test_truncated_ids_keep_the_tokenizers_end_tokens(ids: list[int], special_ids: list[int],
                                                      expected: list[int]) -> None:
    assert truncated_ids(ids, 4, special_ids) == expected


def test_dimensions_keep_the_first_values_at_unit_length() -> None:
    vector = np.array([3, 4, 12, 0], dtype=np.float32) / 13
    np.testing.assert_allclose(shortened(vector, 2), [0.6, 0.8], rtol=1e-6)
    assert shortened(vector, 4) is vector and shortened(vector, None) is vector


def test_dimensions_outside_1_to_the_models_size_give_the_whole_vector_as_ollama() -> None:
    assert embed_dimensions({"dimensions": 64}, 576) == 64 and embed_dimensions({"dimensions": 575}, 576) == 575
    for ignored in ({}, {"dimensions": None}, {"dimensions": 0}, {"dimensions": -3}, {"dimensions": 576},
                    {"dimensions": 100_000}):
        assert embed_dimensions(ignored, 576) is None, ignored
    with pytest.raises(ApiError) as caught:
        embed_dimensions({"dimensions": 64.5}, 576)
    assert (caught.value.status, caught.value.message) == (400, "'dimensions' must be an integer, got 64.5")
