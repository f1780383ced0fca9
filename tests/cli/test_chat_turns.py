"""The REPL's turn handling where timing decides: a Ctrl-C that lands after a line is read but before
the reply's own SIGINT handler is in place must stop that reply, not end the program."""

from __future__ import annotations

import builtins
from types import SimpleNamespace

import pytest

from runner.cli import chat


def _type_lines(monkeypatch, *lines: str) -> None:
    """input() returns these lines, then Ctrl-D."""
    pending = iter(lines)

    def typed(prompt: str = "") -> str:
        try:
            return next(pending)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr(builtins, "input", typed)


class _Runner:
    """Stands in for runner.python_api.Runner: the first reply is interrupted before it starts."""

    def __init__(self) -> None:
        self.loaded = SimpleNamespace(name="stand-in")
        self.asked: list[list[str]] = []

    def stream_chat(self, messages, **_):
        self.asked.append([m.content for m in messages])
        if len(self.asked) == 1:
            raise KeyboardInterrupt
        return iter([SimpleNamespace(token_ids=[1], drafted=[False], text="hi")])


def test_ctrl_c_before_the_reply_starts_stops_it_and_forgets_the_question(monkeypatch, capsys) -> None:
    _type_lines(monkeypatch, "tell me a long story", "say hi")
    runner = _Runner()
    assert chat.run_repl(runner, None) == 0
    out = capsys.readouterr().out
    assert "[0 tokens, 0.0 tok/s, first token n/a, stopped]" in out
    assert "[1 tokens" in out
    assert runner.asked == [["tell me a long story"], ["say hi"]]  # the stopped question was dropped


@pytest.mark.parametrize("reply", ["", "partial"])
def test_a_reply_is_kept_in_the_conversation_only_when_it_has_words(monkeypatch, capsys, reply) -> None:
    _type_lines(monkeypatch, "first", "second")
    asked: list[list[str]] = []

    def stream(messages, **_):
        asked.append([m.content for m in messages])
        return iter([SimpleNamespace(token_ids=[1] if reply else [], drafted=[False] if reply else [], text=reply)])

    runner = SimpleNamespace(loaded=SimpleNamespace(name="stand-in"), stream_chat=stream)
    assert chat.run_repl(runner, None) == 0
    second = asked[1]
    assert second == (["first", "partial", "second"] if reply else ["second"])
