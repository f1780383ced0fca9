"""Splitting <think>…</think> off a reply, whole and as it streams in pieces of any size."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engines import in_process_server, load_tiny, submit_all
from runner.sampling.constraints import GrammarSpec, LazyConstraint, ReasoningGate
from runner.sampling.params import SamplingParams
from runner.scheduler.request import FinishReason, GenerationRequest
from runner.server.reasoning import ReasoningSplitter, split_whole
from tiny_gguf import write_tiny_gguf

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


# -- a grammar after the thinking (constraints.ReasoningGate) ---------------------------------------
SCHEMA = GrammarSpec("json_schema", json.dumps({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0,
                                                                                         "maximum": 9}},
                                                "required": ["a"], "additionalProperties": False}), "response_format")


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory):
    path = write_tiny_gguf(tmp_path_factory.mktemp("think") / "think.gguf", extra_specials=("<think>", "</think>"))
    loaded = load_tiny(path, 1)
    yield loaded
    loaded.close()


def _allowed(gate: ReasoningGate, n_vocab: int) -> set[int]:
    logits = np.zeros(n_vocab, dtype=np.float32)
    gate.mask_into(logits)
    return set(np.flatnonzero(np.isfinite(logits)).tolist())


def test_the_grammar_waits_for_the_thinking_to_close(thinker) -> None:
    think, close = thinker.facts.single_token_id("<think>"), thinker.facts.single_token_id("</think>")
    assert think is not None and close is not None and thinker.facts.single_token_id("{") is not None
    brace, x = thinker.facts.single_token_id("{"), thinker.facts.single_token_id("x")
    n_vocab = thinker.model.n_vocab
    gate = ReasoningGate(lambda: thinker.compile_constraint(SCHEMA), thinker.model.token_bytes, think)
    first = _allowed(gate, n_vocab)
    assert think in first and brace in first and x not in first and close not in first
    gate.advance(think)  # thinking: anything goes
    assert not gate.is_active and _allowed(gate, n_vocab) == set(range(n_vocab))
    for token in (x, brace, x):
        gate.advance(token)
    assert not gate.is_active
    gate.advance(close)  # the grammar from here
    after = _allowed(gate, n_vocab)
    assert gate.is_active and brace in after and think not in after and x not in after
    inside = ReasoningGate(lambda: thinker.compile_constraint(SCHEMA), thinker.model.token_bytes, think,
                           starts_inside=True)  # the template opened the tag: the reply starts thinking
    assert not inside.is_active and brace in _allowed(inside, n_vocab) and x in _allowed(inside, n_vocab)
    plain = ReasoningGate(lambda: thinker.compile_constraint(SCHEMA), thinker.model.token_bytes, think)
    plain.advance(brace)  # no thinking at all: the grammar from the first token
    assert think not in _allowed(plain, n_vocab)


def test_a_constrained_reply_may_think_first_and_then_follows_the_schema(thinker) -> None:
    think, close = thinker.facts.single_token_id("<think>"), thinker.facts.single_token_id("</think>")
    gate = ReasoningGate(lambda: thinker.compile_constraint(SCHEMA), thinker.model.token_bytes, think)
    # the biases make the tiny model think (allowed first), close the thought at once, then answer
    sampling = SamplingParams(temperature=0, logit_bias=((think, 30.0), (close, 60.0)))
    (events,) = submit_all(thinker.engine, [GenerationRequest("r", thinker.text_prompt_ids("hi"), sampling, 40,
                                                              constraint=gate)])
    text = "".join(e.text for e in events)
    reasoning, content = split_whole(text)
    assert text.startswith("<think></think>") and reasoning == ""
    assert set(json.loads(content)) == {"a"} and events[-1].finish_reason is FinishReason.STOP


# -- a thinking budget (thinking.budget_tokens, output_config.effort, reasoning.effort) -------------
def test_at_its_budget_the_thinking_can_only_close(thinker) -> None:
    think, close = thinker.facts.single_token_id("<think>"), thinker.facts.single_token_id("</think>")
    x = thinker.facts.single_token_id("x")
    n_vocab = thinker.model.n_vocab
    gate = ReasoningGate(None, thinker.model.token_bytes, think, budget=2, close_id=close)
    assert not gate.is_active and think in _allowed(gate, n_vocab)  # no grammar: the reply may think
    gate.advance(think)
    assert gate.n_valid([x, x, x, close]) == 2  # drafts stop at the budget
    gate.advance(x)
    assert gate.n_valid([close, x]) == 1 and not gate.is_active
    gate.advance(x)  # two tokens of thinking: the budget
    assert gate.is_active and _allowed(gate, n_vocab) == {close} and gate.forced_tokens() == [close]
    gate.advance(close)
    assert not gate.is_active and _allowed(gate, n_vocab) == set(range(n_vocab))  # no grammar after it
    none = ReasoningGate(None, thinker.model.token_bytes, think, budget=0, close_id=close)
    assert none.is_active and think not in _allowed(none, n_vocab) and none.n_valid([think, x]) == 0
    lazy = ReasoningGate(lambda: LazyConstraint("<tool_call>", lambda: thinker.compile_constraint(SCHEMA),
                                                thinker.model.token_bytes),
                         thinker.model.token_bytes, think, budget=0, close_id=close)  # tools on auto, no thinking
    assert lazy.is_active and think not in _allowed(lazy, n_vocab) and x in _allowed(lazy, n_vocab)
    unbounded = ReasoningGate(None, thinker.model.token_bytes, think, budget=2, close_id=None)  # close not one token
    unbounded.advance(think)
    for _ in range(5):
        unbounded.advance(x)
    assert not unbounded.is_active


def test_a_budgeted_reply_thinks_that_many_tokens_then_follows_its_schema(thinker) -> None:
    think, close = thinker.facts.single_token_id("<think>"), thinker.facts.single_token_id("</think>")
    gate = ReasoningGate(lambda: thinker.compile_constraint(SCHEMA), thinker.model.token_bytes, think, budget=5,
                         close_id=close)
    sampling = SamplingParams(temperature=0, logit_bias=((think, 30.0), (close, -30.0)))  # it would think on
    (events,) = submit_all(thinker.engine, [GenerationRequest("b", thinker.text_prompt_ids("hi"), sampling, 60,
                                                              constraint=gate)])
    ids = [t for e in events for t in e.token_ids]
    assert ids[0] == think and ids.index(close) == 6  # <think>, five tokens, </think>
    reasoning, content = split_whole("".join(e.text for e in events))
    assert set(json.loads(content)) == {"a"} and events[-1].finish_reason is FinishReason.STOP


OPENS_THINKING = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                  "<|im_start|>assistant\n<think>\n")


@pytest.fixture(scope="module")
def thinking_client(tmp_path_factory: pytest.TempPathFactory):
    """The server in-process on a tiny model whose template opens the thinking: every reply starts
    inside it, so a budget decides where it ends."""
    path = write_tiny_gguf(tmp_path_factory.mktemp("opens") / "opens.gguf", extra_specials=("<think>", "</think>"),
                           chat_template=OPENS_THINKING)
    with in_process_server(load_tiny(path, 1, ctx_size=512)) as client:
        yield client


ASK = [{"role": "user", "content": "hi"}]


def _message(client, **body) -> dict:
    reply = client.post("/v1/messages", json={"model": "tiny", "max_tokens": 24, "temperature": 0, "messages": ASK,
                                              **body})
    assert reply.status_code == 200, reply.text
    return {b["type"]: b.get("thinking", b.get("text")) for b in reply.json()["content"]}


def test_a_messages_thinking_budget_ends_the_thinking_there(thinking_client) -> None:
    unbounded = _message(thinking_client, thinking={"type": "adaptive"})
    assert set(unbounded) == {"thinking", "text"} and unbounded["text"] == ""  # thought all 24 tokens
    low = _message(thinking_client, thinking={"type": "adaptive"}, output_config={"effort": "low"})
    assert low == unbounded  # low's 1024 tokens: past max_tokens
    four = _message(thinking_client, thinking={"type": "enabled", "budget_tokens": 4})
    ten = _message(thinking_client, thinking={"type": "enabled", "budget_tokens": 10})
    assert four["text"] and ten["text"]  # the thinking closed: an answer follows
    assert 0 < len(four["thinking"]) < len(ten["thinking"]) and ten["thinking"].startswith(four["thinking"])
    assert unbounded["thinking"].startswith(ten["thinking"])  # greedy: the same thoughts, cut sooner
    disabled = _message(thinking_client, thinking={"type": "disabled"})
    assert set(disabled) == {"text"} and disabled["text"]  # closed at once, and not shown


def test_a_responses_effort_of_none_skips_the_thinking(thinking_client) -> None:
    def output(effort: str | None) -> list[dict]:
        reasoning = {"effort": effort} if effort else {"summary": "auto"}
        reply = thinking_client.post("/v1/responses", json={"model": "tiny", "max_output_tokens": 12, "temperature": 0,
                                                            "input": "hi", "reasoning": reasoning})
        assert reply.status_code == 200, reply.text
        return reply.json()["output"]

    thought = output(None)  # thought until max_output_tokens: no answer
    assert [item["type"] for item in thought] == ["reasoning", "message"] and thought[0]["content"][0]["text"]
    assert thought[1]["content"][0]["text"] == ""
    skipped = output("none")  # closed at once: all answer
    assert [item["type"] for item in skipped] == ["message"] and skipped[0]["content"][0]["text"]


def test_a_schema_after_a_budgeted_thinking_applies_without_tools(thinking_client) -> None:
    """response_format (no tools) on a reasoning model: the grammar starts once the thinking closes
    (here at once: effort none)."""
    reply = thinking_client.post("/v1/responses", json={
        "model": "tiny", "max_output_tokens": 40, "temperature": 0, "input": "hi", "reasoning": {"effort": "none"},
        "text": {"format": {"type": "json_schema", "name": "A", "schema": json.loads(SCHEMA.source)}}})
    assert reply.status_code == 200, reply.text
    assert set(json.loads(reply.json()["output"][-1]["content"][0]["text"])) == {"a"}
