"""gemma 3's sliding-window layers keep only their window and a micro-batch (swa_full off): a prefix
cached past that is computed again, or from the last prompt's end where a checkpoint kept the
window there; a prompt that continues the cache keeps it; and every time the reply is the one a cold
slot gives."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.python_api.runner import Runner

pytestmark = pytest.mark.model

HEAD = "The history of the river town, told one year at a time. "


@pytest.fixture(scope="module")
def gemma(gemma_path: Path) -> Iterator[Runner]:
    r = Runner(gemma_path, log=lambda _: None, ctx_size=4096)
    yield r
    r.close()


def ids(r: Runner, text: str) -> tuple[int, ...]:
    return tuple(r.loaded.model.tokenize(text))


def reply(r: Runner, prompt: tuple[int, ...], n: int = 6) -> tuple[list[tuple[int, float]], int]:
    """Greedy tokens (n of them) with their logprobs, and how many prompt tokens came from the cache."""
    request = dataclasses.replace(r.request(prompt, max_tokens=n, temperature=0), ignore_eos=True, n_top_logprobs=0)
    events = list(r.stream(request))
    return [(t.token_id, t.logprob) for e in events for t in e.logprobs], events[-1].usage.cached_tokens


def cold(r: Runner, prompt: tuple[int, ...], n: int = 6) -> list[int]:
    """The greedy tokens from an empty slot (the numbers may differ in the last bits from a cached
    run's: F16 sums over the KV cells in the order they lie)."""
    r.loaded.runner.kv_remove(0, 0, -1)
    r.loaded.engine.scheduler.pool.slots[0].truncate(0)
    return token_ids(reply(r, prompt, n)[0])


def token_ids(pairs: list[tuple[int, float]]) -> list[int]:
    return [t for t, _ in pairs]


def year_by_year(first: int, last: int) -> str:
    return HEAD + "".join(f"In year {y} the river rose and the mill was rebuilt. " for y in range(first, last))


def test_a_prefix_past_the_window_is_computed_again_and_a_continuation_keeps_the_cache(gemma: Runner) -> None:
    window = gemma.loaded.model.n_swa
    assert window == 512
    long = ids(gemma, year_by_year(1800, 1900))
    assert len(long) > 2 * window + 512  # past the window and a micro-batch: the first cells are gone
    short = ids(gemma, HEAD + "The mill stood by the bridge.")
    shared = next(i for i, (a, b) in enumerate(zip(long, short)) if a != b)
    assert shared > 4

    reply(gemma, long)
    assert gemma.loaded.runner.context.kv_pos_min(0) > 0
    tokens, cached = reply(gemma, short)
    assert cached == 0  # the shared head is cached, but its window is not (nor is a checkpoint): read again
    assert token_ids(tokens) == cold(gemma, short)

    first, _ = reply(gemma, long)
    more = long + tuple(token_ids(first)) + ids(gemma, " Then")[1:]
    tokens, cached = reply(gemma, more)
    assert cached >= len(long)  # continuing the conversation keeps every cached token
    assert token_ids(tokens) == cold(gemma, more)


def test_drafts_rejected_past_the_window_leave_the_reply_as_without_drafts(gemma: Runner, gemma_path: Path) -> None:
    """Verifying drafts decodes past the window and removes what was rejected: the cells the next
    token sees must still be there (the window's cache keeps a micro-batch more than the window)."""
    prompt = ids(gemma, year_by_year(1700, 1790))
    plain = cold(gemma, prompt + ids(gemma, " In year")[1:])
    with Runner(gemma_path, log=lambda _: None, ctx_size=4096, draft="ngram", spec="on") as drafting:
        events = list(drafting.stream(drafting.request(prompt + ids(gemma, " In year")[1:], max_tokens=6,
                                                       temperature=0)))
    usage = events[-1].usage
    assert usage.draft_proposed > usage.draft_accepted > 0  # some drafts kept, some rolled back
    assert [t for e in events for t in e.token_ids] == plain


@pytest.mark.parametrize("n_reply", [320, 800])
def test_after_a_long_reply_the_next_turn_continues_from_the_prompts_end(gemma_path: Path, n_reply: int) -> None:
    """An agent's next turn: the last prompt, then its own words. Where the reply ran past the window,
    the window's cells at the prompt's end are gone, but its checkpoint there serves: only what
    follows the prompt is computed, and its first token's logits are those of a whole-context cache
    (later steps may differ in the last bits: F16 sums over cells in another order). A reply longer
    than the window's cache (800 > 768) leaves nothing in it once the reply is removed: that too is
    a window that does not hold."""
    prompt_years, turn_text = (1800, 1835), " Now, in one word:"
    replies = {}
    for swa_full in ("off", "on"):
        with Runner(gemma_path, log=lambda _: None, ctx_size=4096, batch_size=64, swa_full=swa_full) as r:
            prompt = ids(r, year_by_year(*prompt_years))
            assert len(prompt) > r.loaded.model.n_swa
            if swa_full == "off":  # the window (its cache: 512 + 64 cells, padded to 768) moves on
                reply(r, prompt, n=n_reply)
                assert r.loaded.runner.context.kv_pos_min(0) > len(prompt) - r.loaded.model.n_swa
            else:  # (the reference: the same prompt's KV, whole)
                reply(r, prompt, n=1)
            replies[swa_full] = reply(r, prompt + ids(r, turn_text)[1:], n=1)
    assert replies["off"] == replies["on"]
    assert replies["off"][1] == len(prompt)  # cached: the prompt, from its checkpoint


def test_a_draft_models_context_keeps_its_window_whole(gemma_path: Path) -> None:
    """A drafter reuses its common prefix with the target's tokens without asking the window, so its
    own context keeps sliding-window layers as long as the context (the target's keeps the window)."""
    with Runner(gemma_path, log=lambda _: None, ctx_size=2048, draft=str(gemma_path)) as r:
        assert r.loaded.runner.context.shape.swa_full is False
        assert r.loaded.speculator.drafter.context.shape.swa_full is True


@dataclasses.dataclass
class _Row:  # (runtime.model_runner.DecodeRow)
    seq_id: int
    token_ids: list[int]
    first_pos: int
    n_logits: int = 1


def test_a_checkpoint_past_a_removal_is_dropped_not_offered_for_the_tokens_that_replace_it(gemma: Runner) -> None:
    """A removal from before a slot's checkpoint (a prompt sharing less than the last one) makes the
    checkpoint stale: once other tokens have taken those positions and the window has moved on,
    the slot offers no cached prefix from it."""
    runner, slot = gemma.loaded.runner, gemma.loaded.engine.scheduler.pool.slots[0]
    cold(gemma, ids(gemma, HEAD), n=1)
    first = ids(gemma, year_by_year(1800, 1820))
    assert reply(gemma, first, n=1)[1] > 4  # the head was cached; the checkpoint is at len(first)
    assert runner.usable_prefix(0, len(first)) == len(first)
    n_head = len(ids(gemma, HEAD)) - 1  # (the last token of HEAD may merge with what follows)
    runner.kv_remove(0, n_head, -1)
    slot.truncate(n_head)
    other = list(ids(gemma, year_by_year(1900, 1990))[n_head:])
    for start in range(0, len(other), 512):  # other tokens in those positions, past the window
        runner.decode([_Row(0, other[start:start + 512], n_head + start)])
    assert runner.context.kv_pos_min(0) > len(first)
    assert runner.usable_prefix(0, len(first)) == 0  # not the stale checkpoint's len(first)
    runner.kv_remove(0, 0, -1)
    slot.truncate(0)


def test_a_prompt_copied_from_a_busy_slot_past_its_window_is_computed_again_not_from_the_checkpoint(
        gemma_path: Path) -> None:
    """A request sharing a busy slot's whole prompt, after that slot's reply has run past the window,
    lands in the free slot with a copy of the busy one's KV. llama.cpp copies a KV stream's data at
    the next decode, over any window a checkpoint restored before it, so the checkpoint cannot
    serve there: the prompt is computed again, and the reply is a cold slot's."""
    with Runner(gemma_path, log=lambda _: None, ctx_size=4096, batch_size=64, parallel=2) as r:
        prompt = ids(r, year_by_year(1800, 1835))
        engine, context = r.loaded.engine, r.loaded.runner.context
        first = dataclasses.replace(r.request(prompt, max_tokens=600, temperature=0), ignore_eos=True)
        engine.submit(first, lambda _: None)
        while context.kv_pos_min(0) <= len(prompt) - r.loaded.model.n_swa:  # the busy slot's window moved on:
            engine.step()  # what follows its prompt's end no longer sees all it needs
        assert engine.scheduler.pool.slots[0].seq is not None  # (still busy)
        follow_up = prompt + ids(r, " Now, in one word:")[1:]
        events: list = []
        engine.submit(dataclasses.replace(r.request(follow_up, max_tokens=4, temperature=0), ignore_eos=True),
                      events.append)
        while not (events and events[-1].is_final):
            engine.step()
        assert events[-1].usage.cached_tokens == 0
        engine.cancel(first.request_id)
        while engine.has_work:
            engine.step()
        for slot in engine.scheduler.pool.slots:
            r.loaded.runner.kv_remove(slot.id, 0, -1)
            slot.truncate(0)
        assert [t for e in events for t in e.token_ids] == token_ids(reply(r, follow_up, n=4)[0])
