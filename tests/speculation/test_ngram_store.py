"""The n-gram store learned across requests: what it keeps, its bound, and on a real tiny model a
second request drafting from what the first generated, losslessly, its acceptance counted apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from engines import load_tiny, submit_all, token_ids
from runner.sampling.params import SamplingParams
from runner.scheduler.request import GenerationRequest
from runner.server.metrics import render_metrics
from runner.speculation.drafter import DraftJob
from runner.speculation.ngram_drafter import STORE_KIND, NgramDrafter
from runner.speculation.ngram_store import BYTES_PER_ENTRY, NgramStore


def test_it_chains_what_followed_each_four_tokens() -> None:
    store = NgramStore(1 << 16)
    store.learn([1, 2, 3, 4, 5, 6, 7, 8], start=0)
    assert store.draft([9, 1, 2, 3, 4], k=3) == [5, 6, 7]
    assert store.draft([1, 2, 3, 4], k=9) == [5, 6, 7, 8]  # until nothing is known
    assert store.draft([4, 3, 2, 1], k=3) == [] and store.draft([3, 4], k=3) == []


def test_only_tokens_from_start_on_are_learned() -> None:
    store = NgramStore(1 << 16)
    store.learn([1, 2, 3, 4, 5, 6], start=5)
    assert store.predict((1, 2, 3, 4)) is None and store.predict((2, 3, 4, 5)) == 6


def test_a_continuation_is_replaced_only_once_it_has_lost_more_often_than_it_was_confirmed() -> None:
    store = NgramStore(1 << 16)
    key = (1, 2, 3, 4)
    for _ in range(2):
        store.add(key, 5)
    store.add(key, 9)
    store.add(key, 9)
    assert store.predict(key) == 5  # confirmed twice, challenged twice: not yet
    store.add(key, 9)
    assert store.predict(key) == 9


@pytest.mark.parametrize("budget", [1 << 10, 1 << 20, 10 << 20])
def test_its_memory_stays_within_its_budget_however_much_it_learns(budget: int) -> None:
    store = NgramStore(budget)
    before = store.n_bytes
    store.learn(list(range(50_000)), start=0)
    assert store.n_bytes == before <= budget and store.n_entries * BYTES_PER_ENTRY <= budget
    assert store.n_filled <= store.n_entries


def test_the_drafter_proposes_from_the_context_first_then_from_the_store() -> None:
    store = NgramStore(1 << 16)
    drafter = NgramDrafter(store=store)
    drafter.observe(0, "a", (7, 7, 1, 2), [3, 4, 5, 6])  # request a wrote 3 4 5 6 after ... 1 2
    assert store.predict((7, 1, 2, 3)) == 4 and store.predict((7, 7, 1, 2)) == 3
    from_store = DraftJob(1, [9, 9, 7, 1, 2, 3], k=2, sampling=SamplingParams())
    in_context = DraftJob(1, [1, 2, 3, 8, 1, 2], k=2, sampling=SamplingParams())  # "1 2" was followed by 3
    drafter.propose([from_store, in_context])
    assert (from_store.draft_ids, from_store.kind) == ([4, 5], STORE_KIND)
    assert (in_context.draft_ids, in_context.kind) == ([3, 8], 2)
    assert drafter.kind_name(STORE_KIND) == "store" and drafter.kind_name(2) == "context-2"


def test_the_store_comes_before_a_two_token_match_of_the_context_and_after_a_longer_one() -> None:
    store = NgramStore(1 << 16)
    drafter = NgramDrafter(store=store)
    drafter.observe(0, "a", (7, 7, 1, 2), [3, 4, 5, 6])
    two = DraftJob(1, [9, 1, 2, 5, 7, 7, 1, 2], k=2, sampling=SamplingParams())  # "1 2" was followed by 5
    three = DraftJob(1, [7, 1, 2, 5, 7, 7, 1, 2], k=2, sampling=SamplingParams())  # "7 1 2" was followed by 5
    drafter.propose([two, three])
    assert (two.draft_ids, two.kind) == ([3, 4], STORE_KIND)
    assert (three.draft_ids, three.kind) == ([5, 7], 3)


def test_each_output_token_is_learned_once_and_a_new_request_in_the_slot_starts_over() -> None:
    store = NgramStore(1 << 16)
    drafter = NgramDrafter(store=store)
    drafter.observe(0, "a", (1, 2, 3), [4])
    drafter.observe(0, "a", (1, 2, 3), [4, 5])
    drafter.observe(0, "a", (1, 2, 3), [4, 5])  # nothing new
    assert store.n_filled == 1  # (1 2 3 4) -> 5: the first output token had only 3 before it
    drafter.observe(0, "b", (6, 7, 8, 9), [10])
    assert store.predict((6, 7, 8, 9)) == 10 and store.n_filled == 2


def test_without_a_store_the_drafter_is_the_per_request_one() -> None:
    drafter = NgramDrafter()
    drafter.observe(0, "a", (1, 2, 3, 4), [5, 6])
    job = DraftJob(0, [1, 2, 3, 4], k=2, sampling=SamplingParams())
    drafter.propose([job])
    assert job.draft_ids == [] and drafter.gauges() == {}


def test_a_second_request_drafts_what_the_first_generated_and_keeps_the_plain_output(tiny_gguf: Path) -> None:
    prompt_text, n = "the thin hat in the sea", 40
    plain = load_tiny(tiny_gguf)
    try:
        expected = token_ids(submit_all(plain.engine, [_request(plain, "p", prompt_text, n)])[0])
    finally:
        plain.close()
    results = {}
    for mb in (0, 1):
        loaded = load_tiny(tiny_gguf, 2, draft="ngram", spec="on", draft_max=4, ngram_store_mb=mb)
        try:
            first = submit_all(loaded.engine, [_request(loaded, "first", prompt_text, n)])[0]
            second = submit_all(loaded.engine, [_request(loaded, "second", prompt_text, n)])[0]
            results[mb] = (token_ids(first), token_ids(second), loaded.engine.snapshot().drafts)
        finally:
            loaded.close()
    for first, second, _ in results.values():
        assert first == second == expected  # lossless, store or not
    with_store, without = results[1][2], results[0][2]
    kinds = {kind: (proposed, accepted) for kind, proposed, accepted in with_store.by_kind}
    assert "store" not in {kind for kind, _, _ in without.by_kind}
    proposed, accepted = kinds["store"]
    assert proposed > 0 and accepted / proposed > 0.9  # the second request repeats the first's reply
    assert with_store.n_accepted > without.n_accepted
    gauges = dict(with_store.gauges)
    assert 0 < gauges["ngram_store_entries"] and gauges["ngram_store_bytes"] <= 1 << 20


def test_metrics_give_each_kind_and_the_store_size(tiny_gguf: Path) -> None:
    loaded = load_tiny(tiny_gguf, 1, draft="ngram", spec="on", ngram_store_mb=1)
    try:
        for name in ("a", "b"):
            submit_all(loaded.engine, [_request(loaded, name, "hello the tree in the world", 24)])
        text = render_metrics(loaded.engine.snapshot())
    finally:
        loaded.close()
    assert 'runner_draft_tokens_proposed_by_kind_total{drafter="ngram",kind="store"}' in text
    assert "# TYPE runner_ngram_store_bytes gauge" in text and 'runner_ngram_store_entries{drafter="ngram"}' in text


def _request(loaded, request_id: str, text: str, n: int) -> GenerationRequest:  # type: ignore[no-untyped-def]
    return GenerationRequest(request_id, loaded.text_prompt_ids(text), SamplingParams(temperature=0), n,
                             ignore_eos=True)
