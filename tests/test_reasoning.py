"""Splitting <think>…</think> off a reply, whole and as it streams in pieces of any size."""

from __future__ import annotations

import pytest

from runner.server.reasoning import ReasoningSplitter, split_whole

REPLY = "<think>\nLet me count: 1, 2.\n</think>\n\nTwo."


def streamed(text: str, size: int, starts_inside: bool = False) -> tuple[str, str]:
    splitter = ReasoningSplitter(starts_inside)
    reasoning = content = ""
    for i in range(0, len(text), size):
        r, c = splitter.push(text[i : i + size])
        reasoning, content = reasoning + r, content + c
    r, c = splitter.flush()
    return reasoning + r, content + c


@pytest.mark.parametrize("size", [1, 2, 3, 7, 100])
def test_streamed_in_any_pieces_it_splits_as_the_whole(size: int) -> None:
    assert split_whole(REPLY) == ("\nLet me count: 1, 2.\n", "Two.")
    assert streamed(REPLY, size) == split_whole(REPLY)


def test_a_reply_without_the_tag_is_all_content() -> None:
    for text in ("Hello", "  <b>bold</b>", "<thin ice>", ""):
        assert split_whole(text) == ("", text)
        assert streamed(text, 1) == ("", text)


def test_a_template_that_opened_the_tag_starts_the_reply_inside_it() -> None:
    assert split_whole("plan</think>answer", starts_inside=True) == ("plan", "answer")
    assert streamed("plan</think>answer", 2, starts_inside=True) == ("plan", "answer")


def test_an_unclosed_tag_is_all_reasoning_and_text_after_the_tag_passes_straight() -> None:
    assert split_whole("<think>still thinking</th") == ("still thinking</th", "")
    splitter = ReasoningSplitter()
    splitter.push("<think>a</think>b")
    assert splitter.is_plain and splitter.push("c") == ("", "c")
