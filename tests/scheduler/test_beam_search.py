"""Beam search on the slot engine: beams in slots, KV copied from parent to child, the n best
returned with the model's own logprobs; on the tiny model (against an exhaustive search and
greedy), then over HTTP with vLLM's request convention."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from engines import load_tiny, submit_all
from runner.sampling.params import SamplingParams
from runner.scheduler.beam import BeamSearch
from runner.scheduler.request import BeamParams, FinishReason, GenerationRequest, StreamEvent
from runner.scheduler.sequence import Sequence
from runner.scheduler.slots import Slot
from server_process import ServerProcess

PROMPT = tuple(range(60, 80))
GREEDY = SamplingParams(temperature=0)


def beams(loaded, prompt: tuple[int, ...], width: int, max_tokens: int, **params: object) -> list[StreamEvent]:
    requests = [GenerationRequest(f"b{i}" if i else "b", prompt, GREEDY, max_tokens, ignore_eos=True,
                                  speculate=False, beam=BeamParams(**params)) for i in range(width)]
    out: list[list[StreamEvent]] = [[] for _ in requests]
    loaded.engine.submit_group(requests, [events.append for events in out])
    while loaded.engine.has_work:
        loaded.engine.step()
    assert all(len(events) == 1 for events in out)  # a beam request is answered whole
    return [events[0] for events in out]


def true_logprobs(loaded, prompt: tuple[int, ...], continuation: tuple[int, ...]) -> list[float]:
    """The model's logprob of each continuation token, scored as a prompt (echo's prefill logits)."""
    events = submit_all(loaded.engine, [GenerationRequest("score", prompt + continuation, GREEDY, 0,
                                                          prompt_logprobs=0)])[0]
    return [lp.logprob for lp in events[-1].prompt_logprobs][-len(continuation):]


def test_the_best_beam_beats_greedy_with_true_logprobs(tiny_gguf: Path) -> None:
    loaded = load_tiny(tiny_gguf, 4)
    try:
        greedy_events = submit_all(loaded.engine, [GenerationRequest("g", PROMPT, GREEDY, 3, ignore_eos=True,
                                                                     n_top_logprobs=0)])[0]
        greedy_total = sum(lp.logprob for e in greedy_events for lp in e.logprobs)
        found = beams(loaded, PROMPT, 4, 3)
        totals = [sum(lp.logprob for lp in e.logprobs) for e in found]
        assert totals == sorted(totals, reverse=True) and totals[0] >= greedy_total - 1e-6
        assert len({e.token_ids for e in found}) == 4  # distinct beams
        assert all(e.finish_reason is FinishReason.LENGTH and len(e.token_ids) == 3 for e in found)
        assert beams(loaded, PROMPT, 4, 3) == found  # deterministic
        for event in found:
            np.testing.assert_allclose([lp.logprob for lp in event.logprobs],
                                       true_logprobs(loaded, PROMPT, event.token_ids), atol=1e-3)
    finally:
        loaded.close()


def test_beams_are_the_same_under_load_and_wait_for_their_slots(tiny_gguf: Path) -> None:
    loaded = load_tiny(tiny_gguf, 4)
    try:
        alone = beams(loaded, PROMPT, 3, 4)
        others: list[list[StreamEvent]] = [[], []]
        for i, events in enumerate(others):  # two slots busy: the three beams wait until three are free
            loaded.engine.submit(GenerationRequest(f"o{i}", (9, 8, 7, i), GREEDY, 6, ignore_eos=True), events.append)
        loaded.engine.step()
        assert loaded.engine.scheduler.pool.n_busy == 2
        loaded_again = beams(loaded, PROMPT, 3, 4)
        assert [(e.token_ids, e.logprobs) for e in loaded_again] == [(e.token_ids, e.logprobs) for e in alone]
        assert all(events[-1].finish_reason is FinishReason.LENGTH for events in others)
        assert loaded.engine.scheduler.pool.n_busy == 0
    finally:
        loaded.close()


def test_a_cancelled_beam_request_frees_every_slot(tiny_gguf: Path) -> None:
    loaded = load_tiny(tiny_gguf, 3)
    try:
        requests = [GenerationRequest(f"c{i}" if i else "c", PROMPT, GREEDY, 50, ignore_eos=True, speculate=False,
                                      beam=BeamParams()) for i in range(3)]
        out: list[list[StreamEvent]] = [[], [], []]
        loaded.engine.submit_group(requests, [events.append for events in out])
        for _ in range(3):
            loaded.engine.step()
        assert loaded.engine.scheduler.pool.n_busy == 3
        loaded.engine.cancel("c")  # any one of the group's ids ends the whole search
        while loaded.engine.has_work:
            loaded.engine.step()
        assert loaded.engine.scheduler.pool.n_busy == 0
        assert all(events[-1].finish_reason is FinishReason.CANCELLED for events in out)
    finally:
        loaded.close()


def test_early_stopping_ends_once_enough_beams_have_finished(tiny_gguf: Path) -> None:
    loaded = load_tiny(tiny_gguf, 2)
    try:
        requests = [GenerationRequest(f"e{i}" if i else "e", PROMPT, GREEDY, 40, speculate=False,
                                      beam=BeamParams(early_stopping=True)) for i in range(2)]
        out: list[list[StreamEvent]] = [[], []]
        loaded.engine.submit_group(requests, [events.append for events in out])
        while loaded.engine.has_work:
            loaded.engine.step()
        assert all(len(events) == 1 and events[0].finish_reason is not None for events in out)
    finally:
        loaded.close()


class RecordingKv:
    def __init__(self) -> None:
        self.log: list[tuple] = []

    def kv_remove(self, seq_id: int, p0: int = 0, p1: int = -1) -> bool:
        self.log.append(("rm", seq_id))
        return True

    def kv_copy_all(self, src_seq: int, dst_seq: int) -> None:
        self.log.append(("cp", src_seq, dst_seq))


def _row(logprobs: dict[int, float], n_vocab: int = 6) -> np.ndarray:
    """Logits whose log-softmax gives these tokens (nearly) these logprobs; the rest nearly nothing."""
    row = np.full(n_vocab, -50.0)
    for token, lp in logprobs.items():
        row[token] = lp
    return row


def test_children_of_one_parent_copy_its_kv_and_finished_hypotheses_rank_by_length() -> None:
    events: list[StreamEvent] = []
    requests = [GenerationRequest(f"u{i}", (1, 2, 3), GREEDY, 10, beam=BeamParams(length_penalty=1.0))
                for i in range(2)]
    seqs = [Sequence(r, events.append, lambda t: bytes([97 + t]), frozenset({5})) for r in requests]
    search = BeamSearch(seqs, 1.0, True, lambda t: bytes([97 + t]))
    search.slots = [Slot(0), Slot(1)]
    for slot, seq in zip(search.slots, seqs):
        slot.seq = seq
    search.slots[0].replace([1, 2, 3])
    kv = RecordingKv()
    # step 1: the prompt's row: tokens 1 and 2 lead
    search.collect(search.slots[0], _row({1: np.log(0.6), 2: np.log(0.4)}))
    assert search.advance(kv, 100) == []
    assert [(b.slot.id, b.token_ids) for b in search.beams] == [(0, [1]), (1, [2])]
    assert kv.log == [("rm", 1), ("cp", 0, 1)] and search.slots[1].cached_ids == [1, 2, 3]
    # step 2: both best continuations come from the beam in slot 1: slot 0 takes a copy of slot 1
    kv.log.clear()
    search.collect(search.slots[0], _row({0: 0.0, 1: 0.0, 3: 0.0, 4: 0.0}))  # 0.6 x 0.25 each
    search.collect(search.slots[1], _row({3: 0.0, 4: 0.0}))  # 0.4 x 0.5 each: both best
    search.slots[1].append([2])
    assert search.advance(kv, 100) == []
    assert sorted((b.slot.id, b.token_ids) for b in search.beams) == [(0, [2, 4]), (1, [2, 3])]
    assert kv.log == [("rm", 0), ("cp", 1, 0)] and search.slots[0].cached_ids == [1, 2, 3, 2]
    # step 3: end-of-generation ranks first for both: two finished hypotheses, early stopping ends it
    search.collect(search.slots[0], _row({5: np.log(0.9)}))
    search.collect(search.slots[1], _row({5: np.log(0.8)}))
    assert search.advance(kv, 100) == search.slots and search.is_done
    assert [(e.request_id, e.token_ids, e.finish_reason) for e in events] == [
        ("u0", (2, 3), FinishReason.STOP), ("u1", (2, 4), FinishReason.STOP)]
    assert [e.text for e in events] == ["cd", "ce"]
    assert [round(sum(lp.logprob for lp in e.logprobs), 4) for e in events] == [round(np.log(0.2), 4)] * 2


MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def server(serve_smollm2: Callable[..., ServerProcess]) -> ServerProcess:
    return serve_smollm2("--parallel", "4", "--ctx-size", "512")


PROMPTS = ["The capital of France is", "Translate to French: good morning ->", "def fibonacci(n):",
           "The three primary colors are", "Water boils at"]


@pytest.mark.model
def test_beam_search_over_http_beats_greedy_on_five_prompts(server: ServerProcess) -> None:
    for prompt in PROMPTS:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "ignore_eos": True}
        greedy = server.post("/v1/completions", json={**body, "temperature": 0, "logprobs": 0}).json()["choices"][0]
        r = server.post("/v1/completions", json={**body, "n": 3, "use_beam_search": True, "logprobs": 0})
        assert r.status_code == 200, r.text
        choices = r.json()["choices"]
        totals = [sum(c["logprobs"]["token_logprobs"]) for c in choices]
        assert [c["index"] for c in choices] == [0, 1, 2] and totals == sorted(totals, reverse=True)
        assert totals[0] >= sum(greedy["logprobs"]["token_logprobs"]) - 1e-4, prompt
        assert len({c["text"] for c in choices}) == 3
        again = server.post("/v1/completions", json={**body, "n": 3, "use_beam_search": True, "logprobs": 0})
        assert [c["text"] for c in again.json()["choices"]] == [c["text"] for c in choices]


@pytest.mark.model
def test_chat_beam_search_and_its_usage(server: ServerProcess) -> None:
    r = server.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "Name a fruit."}], "n": 2, "use_beam_search": True,
        "max_tokens": 12, "length_penalty": 0.8, "early_stopping": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["choices"]) == 2 and all(c["message"]["content"] for c in body["choices"])
    assert body["usage"]["completion_tokens"] <= 24


@pytest.mark.model
@pytest.mark.parametrize(("body", "param"), [
    ({"use_beam_search": True}, "n"),
    ({"use_beam_search": True, "n": 2, "stream": True}, "use_beam_search"),
    ({"use_beam_search": True, "n": 2, "best_of": 3}, "best_of"),
    ({"use_beam_search": True, "n": 2, "stop": ["x"]}, "stop"),
    ({"use_beam_search": True, "n": 2, "response_format": {"type": "json_object"}}, "use_beam_search"),
    ({"use_beam_search": True, "n": 2, "length_penalty": "long"}, "length_penalty"),
    ({"length_penalty": 2.0}, "length_penalty"),
])
def test_beam_misuse_names_the_field(server: ServerProcess, body: dict, param: str) -> None:
    r = server.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 4, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.mark.model
def test_runner_run_beams_prints_the_best_first(cache_env: Path, smollm2_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "runner", "run", "-p", "Name a fruit.", "--beams", "3",
                           "--max-tokens", "10", "-q"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    headers = [line for line in proc.stdout.splitlines() if line.startswith("--- beam ")]
    assert [h.split()[2] for h in headers] == ["1", "2", "3"]
    bad = subprocess.run([sys.executable, "-m", "runner", "run", "-p", "x", "--beams", "1", "-q"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and bad.stderr.strip() == "runner: error: --beams needs at least 2 beams"
