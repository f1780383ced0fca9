"""One engine step on the scripted fake runtime: what it counts, jump-forward, a failed decode."""

from __future__ import annotations

import numpy as np

from engines import fake_engine
from fake_runtime import FakeRuntime, ScriptedGrammar
from runner.sampling.params import SamplingParams
from runner.scheduler.request import FinishReason, GenerationRequest, StreamEvent
from runner.scheduler.slots import SlotState

GREEDY = SamplingParams(temperature=0)


def test_a_step_counts_prompt_cached_and_generated_tokens() -> None:
    engine, rt = fake_engine(n_slots=1)
    first: list[StreamEvent] = []
    engine.submit(GenerationRequest("a", tuple(range(1, 11)), GREEDY, 3), first.append)
    while engine.has_work:
        engine.step()
    stats = engine.stats
    assert (stats.n_requests, stats.n_prompt_tokens, stats.n_cached_prompt_tokens, stats.n_generated_tokens,
            stats.n_steps) == (1, 10, 0, 3, 3)
    second: list[StreamEvent] = []  # the slot holds 1..12: ten prompt tokens come from its cache
    engine.submit(GenerationRequest("b", tuple(range(1, 11)) + (20,), GREEDY, 1), second.append)
    while engine.has_work:
        engine.step()
    assert rt.batches[-1] == [(0, [20], 10, 1)]
    assert (stats.n_requests, stats.n_prompt_tokens, stats.n_cached_prompt_tokens, stats.n_generated_tokens,
            stats.n_steps) == (2, 11, 10, 4, 4)
    assert second[-1].usage.cached_tokens == 10


def test_a_grammars_forced_tokens_ride_in_one_step() -> None:
    def run(jump_forward: bool) -> tuple[list[int], list, int, int]:
        engine, rt = fake_engine(n_slots=1)
        engine.jump_forward = jump_forward
        events: list[StreamEvent] = []
        engine.submit(GenerationRequest("a", (1, 2, 3, 4), GREEDY, 5, constraint=ScriptedGrammar([5, 6, 7, 8, 9])),
                      events.append)
        while engine.has_work:
            engine.step()
        return [t for e in events for t in e.token_ids], rt.batches, engine.stats.n_forced_tokens, engine.stats.n_steps

    ids, batches, n_forced, n_steps = run(jump_forward=True)
    # the first token is the prompt's; then 6, 7, 8 are forced drafts beside it and 9 is the target's own
    assert ids == [5, 6, 7, 8, 9]
    assert batches == [[(0, [1, 2, 3, 4], 0, 1)], [(0, [5, 6, 7, 8], 4, 4)]]
    assert (n_forced, n_steps) == (3, 2)
    ids, batches, n_forced, n_steps = run(jump_forward=False)
    assert ids == [5, 6, 7, 8, 9]
    assert batches[1:] == [[(0, [5], 4, 1)], [(0, [6], 5, 1)], [(0, [7], 6, 1)], [(0, [8], 7, 1)]]
    assert (n_forced, n_steps) == (0, 5)


class FailingRuntime(FakeRuntime):
    """The fake runtime whose second decode fails, as llama_decode does when the KV is full."""

    def decode(self, rows: list) -> list[np.ndarray]:
        if len(self.batches) == 1:
            self.batches.append([])
            raise RuntimeError("llama_decode failed: 1 (no KV slot)")
        return super().decode(rows)


def test_a_failed_decode_ends_its_requests_and_forgets_their_kv() -> None:
    rt = FailingRuntime()
    engine, _ = fake_engine(n_slots=2, runtime=rt)
    events: list[list[StreamEvent]] = [[], []]
    for i in range(2):
        engine.submit(GenerationRequest(f"r{i}", (10 * i + 1, 10 * i + 2), GREEDY, 5), events[i].append)
    assert engine.step() == 4
    assert engine.step() == 0
    assert [(e[-1].finish_reason, e[-1].error) for e in events] == [
        (FinishReason.ERROR, "llama_decode failed: 1 (no KV slot)")] * 2
    assert [(s.state, s.n_cached) for s in engine.scheduler.pool.slots] == [(SlotState.IDLE, 0)] * 2
    assert rt.kv == {0: [], 1: []}
    assert (engine.stats.n_steps, engine.stats.n_generated_tokens) == (1, 2)  # the failed step counts nothing
    assert not engine.has_work
