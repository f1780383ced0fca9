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
        return (e for e in [SimpleNamespace(token_ids=[1], drafted=[False], text="hi", error=None)])


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
        return (e for e in [SimpleNamespace(token_ids=[1] if reply else [], drafted=[False] if reply else [], text=reply,
                                            error=None)])

    runner = SimpleNamespace(loaded=SimpleNamespace(name="stand-in"), stream_chat=stream)
    assert chat.run_repl(runner, None) == 0
    second = asked[1]
    assert second == (["first", "partial", "second"] if reply else ["second"])


def test_a_closed_output_cancels_the_reply_at_once(tiny_gguf) -> None:
    """`runner run ... | head -c 20`: the write fails, and the request is cancelled then, not when the
    generator is collected (an 'Exception ignored' traceback, after the Runner had closed)."""
    from runner.python_api.runner import Runner

    class ClosedPipe:
        def write(self, text: str) -> None:
            raise BrokenPipeError

        def flush(self) -> None:
            pass

    with Runner(tiny_gguf, log=lambda _: None) as r:
        with pytest.raises(BrokenPipeError) as raised:  # (its traceback keeps stream_events' frame alive)
            chat.stream_reply(r, [chat.Message("user", "hi")], ClosedPipe(), max_tokens=50)
        assert not r.loaded.engine.has_work
        del raised


def test_a_failed_reply_is_an_error_not_a_short_reply(tiny_gguf, monkeypatch) -> None:
    """(the CLI printed what came before the error and exited 0)"""
    from runner.core.errors import RunnerError
    from runner.python_api import runner as api
    from runner.python_api.runner import Runner
    from runner.sampling.params import SamplingParams

    monkeypatch.setattr(api, "checked_sampling", lambda **kw: SamplingParams(**kw))
    with Runner(tiny_gguf, log=lambda _: None) as r, pytest.raises(RunnerError, match="internal error"):
        chat.stream_reply(r, [chat.Message("user", "hi")], SimpleNamespace(write=lambda t: None, flush=lambda: None),
                          temperature="0", max_tokens=5)
