"""`runner chat` driven through a pseudo-terminal, as a person types into it."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pexpect
import pytest

pytestmark = pytest.mark.model
PROMPT = ">>> "
STATS = re.compile(r"\[(\d+) tokens, [\d.]+ tok/s, first token \d+ ms(?:, \d+ from drafts \(\d+%\))?(, stopped)?\]")


@pytest.fixture
def chat(smollm2_path: Path, model_cache: Path, request: pytest.FixtureRequest):
    max_tokens = getattr(request, "param", 400)  # (a test that needs no long reply asks for fewer)
    child = pexpect.spawn(
        sys.executable,
        ["-m", "runner", "chat", "smollm2-135m-instruct", "--temperature", "0", "--max-tokens", str(max_tokens), "-q"],
        env={**os.environ, "RUNNER_CACHE_DIR": str(model_cache), "TERM": "dumb"},
        encoding="utf-8",
        timeout=240,  # a reply may run to 400 tokens on a machine loaded by other work: wait for it
        dimensions=(50, 400),
    )
    child.expect_exact(PROMPT)
    yield child
    child.terminate(force=True)


def ask(child: pexpect.spawn, text: str) -> tuple[str, re.Match]:
    child.sendline(text)
    child.expect(STATS)
    reply = child.before.split(text, 1)[-1].strip()
    match = child.match
    child.expect_exact(PROMPT)
    return reply, match


def test_reply_streams_and_ctrl_c_stops_it_without_exiting(chat: pexpect.spawn) -> None:
    chat.sendline("Write a very long story about a dragon who learns to bake bread.")
    chat.expect_exact("bake bread.\r\n")  # the terminal's echo of the line, not yet the reply
    chat.expect(r"\w+ \w+ \w+")  # the reply has started streaming
    chat.sendintr()
    chat.expect(STATS)
    assert chat.match.group(2) == ", stopped"
    assert int(chat.match.group(1)) < 400
    chat.expect_exact(PROMPT)
    chat.sendline("/help")  # the program is still alive and answering
    chat.expect_exact("commands: /exit")
    chat.expect_exact(PROMPT)
    chat.sendline("/exti")  # a mistyped command is said to be one, not sent to the model
    chat.expect_exact("(unknown command /exti; /help lists them)")
    chat.expect_exact(PROMPT)
    chat.sendline("/exit")
    chat.expect(pexpect.EOF)


@pytest.mark.parametrize("chat", [48], indirect=True)
def test_clear_resets_history(chat: pexpect.spawn) -> None:
    first, _ = ask(chat, "What is the capital of France?")
    second, _ = ask(chat, "And of Italy?")
    chat.sendline("/clear")
    chat.expect_exact("(conversation cleared)")
    chat.expect_exact(PROMPT)
    again, _ = ask(chat, "What is the capital of France?")
    assert first and again == first
    assert second != first


def test_ctrl_d_exits(chat: pexpect.spawn) -> None:
    chat.sendeof()
    chat.expect(pexpect.EOF)
    chat.close()
    assert chat.exitstatus == 0


@pytest.mark.parametrize("raw", [False, True])
def test_ctrl_c_stops_a_run_with_its_stats_and_exit_status_130(smollm2_path: Path, model_cache: Path, raw: bool) -> None:
    """A cut reply is told apart from a whole one by the exit status, with or without the template."""
    args = ["-m", "runner", "run", "smollm2-135m-instruct", "-p", "1, 2, 3, 4, 5, 6, 7,", "--temperature", "0",
            "--max-tokens", "2000", "--stats", "-q"] + (["--raw"] if raw else [])
    child = pexpect.spawn(sys.executable, args, env={**os.environ, "RUNNER_CACHE_DIR": str(model_cache), "TERM": "dumb"},
                          encoding="utf-8", timeout=240)
    child.expect(r"\d+, \d+, \d+")  # the reply has started streaming
    child.sendintr()
    child.expect(STATS)
    assert child.match.group(2) == ", stopped" and int(child.match.group(1)) < 2000
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130
