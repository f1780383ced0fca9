"""The engine on a real llama.cpp context (tiny random model): batching must not change results."""

from __future__ import annotations

from pathlib import Path

import pytest

from engines import load_tiny
from runner.model.loaded_model import LoadedModel
from runner.scheduler.request import GenerationRequest, StreamEvent
from runner.sampling.params import SamplingParams

PROMPTS = ["hello the world", "in the beginning", "a b c d e f", "the thin thing", "zz top", "éèê ok"]


def load(path: Path, parallel: int, batch: int = 64) -> LoadedModel:
    return load_tiny(path, parallel, batch_size=batch)


def generate(loaded: LoadedModel, prompts: list[str], sampling: SamplingParams, max_tokens: int = 24) -> list[list[int]]:
    results: list[list[StreamEvent]] = []
    for i, text in enumerate(prompts):
        events: list[StreamEvent] = []
        req = GenerationRequest(f"r{i}", loaded.text_prompt_ids(text), sampling, max_tokens, ignore_eos=True)
        loaded.engine.submit(req, events.append)
        results.append(events)
    while loaded.engine.has_work:
        loaded.engine.step()
    return [[t for e in evs for t in e.token_ids] for evs in results]


@pytest.fixture(scope="module")
def alone(tiny_gguf: Path) -> list[list[int]]:
    loaded = load(tiny_gguf, parallel=1)
    try:
        return [generate(loaded, [p], SamplingParams(temperature=0))[0] for p in PROMPTS]
    finally:
        loaded.close()


def test_concurrent_greedy_equals_each_alone(tiny_gguf: Path, alone: list[list[int]]) -> None:
    loaded = load(tiny_gguf, parallel=4, batch=16)  # 6 requests > 4 slots; small budget forces chunking
    try:
        together = generate(loaded, PROMPTS, SamplingParams(temperature=0))
    finally:
        loaded.close()
    assert all(len(t) == 24 for t in together)
    assert together == alone


def test_kv_matches_slot_bookkeeping(tiny_gguf: Path) -> None:
    loaded = load(tiny_gguf, parallel=4)
    try:
        generate(loaded, PROMPTS[:3], SamplingParams(temperature=0), max_tokens=5)
        for slot in loaded.engine.scheduler.pool.slots:
            assert loaded.runner.context.kv_pos_max(slot.id) == slot.n_cached - 1
    finally:
        loaded.close()


def test_prefix_reuse_gives_the_cold_output(tiny_gguf: Path, alone: list[list[int]]) -> None:
    loaded = load(tiny_gguf, parallel=2)
    try:
        generate(loaded, ["hello the world and more"], SamplingParams(temperature=0))
        events: list[StreamEvent] = []
        loaded.engine.submit(
            GenerationRequest("warm", loaded.text_prompt_ids(PROMPTS[0]), SamplingParams(temperature=0), 24, ignore_eos=True),
            events.append,
        )
        while loaded.engine.has_work:
            loaded.engine.step()
    finally:
        loaded.close()
    assert events[-1].usage.cached_tokens > 0
    assert [t for e in events for t in e.token_ids] == alone[0]


def test_seeded_sampling_is_reproducible_and_seed_dependent(tiny_gguf: Path) -> None:
    loaded = load(tiny_gguf, parallel=2)
    try:
        hot = dict(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)
        a = generate(loaded, PROMPTS[:2], SamplingParams(seed=3, **hot))
        b = generate(loaded, PROMPTS[:2], SamplingParams(seed=3, **hot))
        c = generate(loaded, PROMPTS[:2], SamplingParams(seed=4, **hot))
    finally:
        loaded.close()
    assert a == b
    assert a != c


LONG_SYSTEM = "the thin thing in the hat " * 12  # ~100+ tokens of shared prefix


def test_kv_copied_from_another_slot_gives_fresh_prefill_logits(tiny_model) -> None:
    import numpy as np

    from runner.runtime.llama import Batch, Context, ContextShape

    ids = tiny_model.tokenize(LONG_SYSTEM + "and more words", add_special=False)
    n = len(ids) - 1
    ctx = Context(tiny_model, ContextShape(3, 512, 512, 2, kv_unified=False))
    batch = Batch(512)

    def decode(seq_id: int, tokens: list[int], pos: int, n_logits: int) -> np.ndarray:
        batch.clear()
        batch.add(seq_id, tokens, pos, n_logits)
        return ctx.decode(batch).copy()

    try:
        # slot 0 holds the prefix, then tokens of its own (a busy slot that kept generating)
        decode(0, ids[:n], 0, 0)
        for i, t in enumerate([5, 6, 7]):
            decode(0, [t], n + i, 1)
        ctx.kv_copy(0, 1, -1, -1)
        ctx.kv_remove(1, n, -1)
        copied = decode(1, ids[n:], n, 1)[0]  # slot 1 continues from the copied prefix
        decode(2, ids[:n], 0, 0)  # slot 2 computes the same prefix fresh, in the same batch shapes
        fresh = decode(2, ids[n:], n, 1)[0]
        assert ctx.kv_pos_max(1) == ctx.kv_pos_max(2) == len(ids) - 1
        assert ctx.kv_pos_max(0) == n + 2  # the source is untouched
    finally:
        ctx.close()
    assert np.array_equal(copied, fresh)


def test_request_reusing_a_busy_slots_prefix_gives_the_cold_output(tiny_gguf: Path) -> None:
    cold = load(tiny_gguf, parallel=1, batch=256)
    try:
        expected = generate(cold, [LONG_SYSTEM + "zz top"], SamplingParams(temperature=0))[0]
    finally:
        cold.close()
    warm = load(tiny_gguf, parallel=2, batch=256)
    try:
        engine = warm.engine
        busy: list[StreamEvent] = []
        engine.submit(GenerationRequest("busy", warm.text_prompt_ids(LONG_SYSTEM + "in the beginning"),
                                        SamplingParams(temperature=0), 60, ignore_eos=True), busy.append)
        engine.step()
        engine.step()
        events: list[StreamEvent] = []
        engine.submit(GenerationRequest("warm", warm.text_prompt_ids(LONG_SYSTEM + "zz top"),
                                        SamplingParams(temperature=0), 24, ignore_eos=True), events.append)
        while engine.has_work:
            engine.step()
        assert engine.scheduler.n_copied_prompt_tokens > 64
    finally:
        warm.close()
    assert events[-1].usage.cached_tokens > 64
    assert [t for e in events for t in e.token_ids] == expected


def test_a_stop_strings_tokens_have_no_logprobs_their_text_was_cut(tiny_gguf: Path) -> None:
    """Each logprob went out with its token, so a reply cut by a stop string still had the logprobs
    (and completions' tokens and text offsets) of the tokens that spelled the stop string."""
    from engines import submit_all

    loaded = load_tiny(tiny_gguf, 1)
    try:
        prompt, greedy = tuple(range(40, 60)), SamplingParams(temperature=0)
        ask = dict(sampling=greedy, max_tokens=16, n_top_logprobs=0, ignore_eos=True)
        full = submit_all(loaded.engine, [GenerationRequest("full", prompt, **ask)])[0]
        ids = [t for e in full for t in e.token_ids]
        pieces = [loaded.model.token_bytes(t).decode("utf-8", "replace") for t in ids]
        text = "".join(pieces)
        cut = next(i for i in range(4, len(ids) - 2)  # a token whose text first appears where it stands
                   if pieces[i] and text.find(pieces[i] + pieces[i + 1]) == len("".join(pieces[:i])))
        stop = pieces[cut] + pieces[cut + 1]
        events = submit_all(loaded.engine, [GenerationRequest("cut", prompt, stop=(stop,), **ask)])[0]
        assert "".join(e.text for e in events) == "".join(pieces[:cut])
        assert [lp.token_id for e in events for lp in e.logprobs] == ids[:cut]  # (ids[:cut + 2] before)
        assert events[-1].stop_string == stop
    finally:
        loaded.close()
