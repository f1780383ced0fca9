"""The streamed chunks' fast path writes exactly what building and encoding the envelope writes."""

from __future__ import annotations

import pytest

from runner.scheduler.request import FinishReason, StreamEvent, Usage
from runner.server.responses import ResponseBuilder, sse

EVENTS = [
    StreamEvent("r1", "Hello", (1,), (False,)),
    StreamEvent("r1", ' "quoted"\n\tand \\ back', (2, 3), (True, False)),
    StreamEvent("r1", "café ✓ 猫", (4,), (False,)),
    StreamEvent("r1", "", (5,), (False,)),  # held back (a possible stop string): nothing to send
    StreamEvent("r1", "x", (6,), ()),
    StreamEvent("r1", " end", (7,), (False,), finish_reason=FinishReason.LENGTH, usage=Usage(3, 7, 0, 1, 1)),
]


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_a_streamed_chunk_is_the_encoded_envelope_byte_for_byte(kind: str) -> None:
    fast = ResponseBuilder(kind, "r1", "smol", lambda t: b"?", wants_logprobs=False)
    slow = ResponseBuilder(kind, "r1", "smol", lambda t: b"?", wants_logprobs=False)
    slow.created = fast.created
    for event in EVENTS:
        chunk = slow.chunk(event)
        assert fast.chunk_sse(event) == (None if chunk is None else sse(chunk))
    assert fast.whole() == slow.whole()


def test_a_whole_chat_reply_has_the_fields_openais_spec_requires() -> None:
    builder = ResponseBuilder("chat", "r1", "smol", lambda t: b"?", wants_logprobs=False)
    for event in EVENTS:
        builder.add(event)
    whole = builder.whole()
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": 'Hello "quoted"\n\tand \\ backcafé ✓ 猫x end',
                                              "refusal": None}
    assert "system_fingerprint" not in whole  # a string or absent, never null
    assert "system_fingerprint" not in builder.chunk(EVENTS[0])
