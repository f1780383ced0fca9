"""The streamed chunks' fast path writes exactly what building and encoding the envelope writes."""

from __future__ import annotations

import json

import pytest

from runner.scheduler.request import FinishReason, StreamEvent, Usage
from runner.server.openai_chat_replies import ChatReplyBuilder, CompletionReplyBuilder
from runner.server.replies import sse

EVENTS = [
    StreamEvent("r1", "Hello", (1,), (False,)),
    StreamEvent("r1", ' "quoted"\n\tand \\ back', (2, 3), (True, False)),
    StreamEvent("r1", "café ✓ 猫", (4,), (False,)),
    StreamEvent("r1", "", (5,), (False,)),  # held back (a possible stop string): nothing to send
    StreamEvent("r1", "x", (6,), ()),
    StreamEvent("r1", " end", (7,), (False,), finish_reason=FinishReason.LENGTH, usage=Usage(3, 7, 0, 1, 1)),
]


@pytest.mark.parametrize("kind", [ChatReplyBuilder, CompletionReplyBuilder])
def test_a_streamed_chunk_is_the_encoded_envelope_byte_for_byte(kind: type) -> None:
    fast = kind("r1", "smol", lambda t: b"?", wants_logprobs=False)
    slow = kind("r1", "smol", lambda t: b"?", wants_logprobs=False)
    slow.created = fast.created
    for event in EVENTS:
        chunk = slow.chunk(event)
        assert fast.chunk_sse(event) == (None if chunk is None else sse(chunk))
    assert fast.whole() == slow.whole()


def test_a_whole_chat_reply_has_the_fields_openais_spec_requires() -> None:
    builder = ChatReplyBuilder("r1", "smol", lambda t: b"?", wants_logprobs=False)
    for event in EVENTS:
        builder.add(event)
    whole = builder.whole()
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": 'Hello "quoted"\n\tand \\ backcafé ✓ 猫x end',
                                              "refusal": None}
    assert "system_fingerprint" not in whole  # a string or absent, never null
    assert "system_fingerprint" not in builder.chunk(EVENTS[0])


def test_calls_are_read_after_the_reasoning() -> None:
    from runner.server.reasoning import ReasoningSplitter
    from runner.prompt.tools import HERMES, Tool, ToolReading

    reading = ToolReading(HERMES, (Tool("add", "", {"type": "object"}),))
    text = '<think>I should add.</think><tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    for streamed in (False, True):
        builder = ChatReplyBuilder("r1", "smol", lambda t: b"?", False, ReasoningSplitter(), reading)
        event = StreamEvent("r1", text, (1,), (False,), finish_reason=FinishReason.STOP, usage=Usage(3, 1, 0, 0, 0))
        if streamed:
            chunks = [json.loads(line[6:]) for line in builder.chunk_sse(event).split("\n\n") if line]
            deltas = [c["choices"][0]["delta"] for c in chunks]
            assert deltas[0] == {"reasoning_content": "I should add."}
            assert deltas[1]["tool_calls"][0]["function"]["name"] == "add"
            assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
        else:
            builder.add(event)
            message = builder.whole()["choices"][0]["message"]
            assert message["reasoning_content"] == "I should add." and message["content"] is None
            assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"a": 1}


@pytest.mark.parametrize("kind", [ChatReplyBuilder, CompletionReplyBuilder])
@pytest.mark.parametrize("fast", [True, False])
def test_every_tokens_drafted_flag_is_sent_though_its_event_had_no_text(kind: type, fast: bool) -> None:
    """A token that is half a UTF-8 character sends no chunk: its flag rides on the next one."""
    builder = kind("r1", "smol", lambda t: b"?", wants_logprobs=False)
    events = [StreamEvent("r1", "", (1,), (True,)), StreamEvent("r1", "猫", (2,), (False,)),
              StreamEvent("r1", "", (3,), (True,)),
              StreamEvent("r1", "", (4,), (False,), finish_reason=FinishReason.LENGTH, usage=Usage(3, 4, 0, 2, 2))]
    sent = [builder.chunk_sse(e) if fast else (lambda c: None if c is None else sse(c))(builder.chunk(e))
            for e in events]
    chunks = [json.loads(s[6:]) for s in sent if s is not None]
    assert [c["choices"][0].get("drafted") for c in chunks] == [[True, False], [True, False]]


def test_a_reply_held_for_tool_calls_sends_every_drafted_flag_at_its_end() -> None:
    from runner.prompt.tools import HERMES, Tool, ToolReading

    reading = ToolReading(HERMES, (Tool("add", "", {"type": "object"}),))
    builder = ChatReplyBuilder("r1", "smol", lambda t: b"?", False, None, reading)
    events = [StreamEvent("r1", '<tool_call>{"name": "add", ', (1, 2), (False, True)),
              StreamEvent("r1", '"arguments": {"a": 1}}</tool_call>', (3,), (True,), finish_reason=FinishReason.STOP,
                          usage=Usage(3, 3, 0, 2, 2))]
    sent = [builder.chunk_sse(e) for e in events]
    assert sent[0] is None
    chunks = [json.loads(line[6:]) for line in sent[1].split("\n\n") if line]
    assert [c["choices"][0].get("drafted") for c in chunks] == [None, None, [False, True, True]]


def test_text_beside_tools_streams_before_the_reply_ends_then_the_calls() -> None:
    """(With tools offered, every delta waited for the whole reply.)"""
    from runner.prompt.tools import HERMES, Tool, ToolReading

    reading = ToolReading(HERMES, (Tool("add", "", {"type": "object"}),))
    builder = ChatReplyBuilder("r1", "smol", lambda t: b"?", False, None, reading)
    # (the reply may be only calls, whose content is null: it began "content": "", which SDKs kept)
    assert builder.first_chunk()["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert ChatReplyBuilder("r1", "smol", lambda t: b"?", False).first_chunk()["choices"][0]["delta"]["content"] == ""
    pieces = ["Sure", ", adding", ".\n<tool_call>", '{"name": "add", "arguments": {"a": 1}}</tool_call>']
    sent = [builder.chunk_sse(StreamEvent("r1", text, finish_reason=FinishReason.STOP if i == 3 else None,
                                          usage=Usage(3, 4) if i == 3 else None)) for i, text in enumerate(pieces)]
    deltas = [json.loads(line[6:])["choices"][0] for part in sent if part for line in part.split("\n\n") if line]
    assert [d["delta"].get("content") for d in deltas[:3]] == ["Sure", ", adding", "."]
    assert deltas[3]["delta"]["tool_calls"][0]["function"]["name"] == "add"
    assert deltas[4]["delta"]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'
    assert deltas[-1]["finish_reason"] == "tool_calls"


def test_logprobs_beside_tools_stream_as_the_whole_reply_lists_them() -> None:
    """(with tools every chunk carried logprobs null, though the whole reply had them)"""
    from runner.prompt.tools import HERMES, Tool, ToolReading
    from runner.scheduler.request import TokenLogprob

    reading = ToolReading(HERMES, (Tool("add", "", {"type": "object"}),))
    builder = ChatReplyBuilder("r1", "smol", lambda t: bytes([96 + t]), True, None, reading)
    events = [StreamEvent("r1", "Hi", (1,), logprobs=(TokenLogprob(1, -0.5),)),
              StreamEvent("r1", " <tool_call>", (2,), logprobs=(TokenLogprob(2, -0.25),)),
              StreamEvent("r1", '{"name": "add", "arguments": {}}</tool_call>', (3,), logprobs=(TokenLogprob(3, -1.0),),
                          finish_reason=FinishReason.STOP, usage=Usage(3, 3))]
    sent = "".join(builder.chunk_sse(e) or "" for e in events)
    chunks = [json.loads(line[6:])["choices"][0] for line in sent.split("\n\n") if line]
    streamed = [lp["logprob"] for c in chunks if c["logprobs"] for lp in c["logprobs"]["content"]]
    assert streamed == [-0.5, -0.25, -1.0] == [lp["logprob"] for lp in builder.whole_choice()["logprobs"]["content"]]
