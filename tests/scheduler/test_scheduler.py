"""Scheduler and slot bookkeeping against a fake runtime: no model needed."""

from __future__ import annotations

import pytest

from engines import fake_engine
from fake_runtime import FakeRuntime
from runner.scheduler.engine import Engine
from runner.scheduler.request import FinishReason, GenerationRequest, StreamEvent
from runner.sampling.params import SamplingParams
from runner.scheduler.scheduler import PromptTooLongError, QueueFullError
from runner.scheduler.slots import SlotState

GREEDY = SamplingParams(temperature=0)


def make_engine(n_slots: int = 2, n_batch: int = 64, n_ctx: int = 128, max_queue: int = 8) -> tuple[Engine, FakeRuntime]:
    return fake_engine(n_slots, n_ctx, n_batch, max_queue)


def submit(engine: Engine, rid: str, prompt: list[int], max_tokens: int = 3) -> list[StreamEvent]:
    events: list[StreamEvent] = []
    engine.submit(GenerationRequest(rid, tuple(prompt), GREEDY, max_tokens), events.append)
    return events


def run_all(engine: Engine) -> None:
    while engine.has_work:
        engine.step()
        for slot in engine.scheduler.pool.slots:  # invariant: the slot mirrors its KV exactly
            assert engine.runtime.kv.get(slot.id, []) == slot.cached_ids


def test_fifo_admission_and_queue() -> None:
    engine, rt = make_engine(n_slots=2)
    evs = [submit(engine, f"r{i}", [10 + i, 20 + i]) for i in range(4)]
    engine.step()
    assert [s.seq.request_id for s in engine.scheduler.pool.slots] == ["r0", "r1"]
    assert [s.request_id for s in engine.scheduler.waiting] == ["r2", "r3"]
    run_all(engine)
    for i, ev in enumerate(evs):
        assert [e.token_ids for e in ev] == [(21 + i,), (22 + i,), (23 + i,)]
        assert ev[-1].finish_reason is FinishReason.LENGTH
        assert ev[-1].usage.prompt_tokens == 2 and ev[-1].usage.completion_tokens == 3
        assert "".join(e.text for e in ev) == f"<{21 + i}><{22 + i}><{23 + i}>"


def test_token_budget_and_chunked_prefill_order() -> None:
    engine, rt = make_engine(n_slots=3, n_batch=8)
    submit(engine, "a", [1, 2], max_tokens=5)
    engine.step()  # a prefilled, generating
    submit(engine, "b", list(range(10, 20)))
    submit(engine, "c", list(range(30, 35)))
    engine.step()
    # a's decode row first, then b's first chunk under the 8-token budget; c must wait
    assert rt.batches[-1] == [(0, [3], 2, 1), (1, list(range(10, 17)), 0, 0)]
    engine.step()
    assert rt.batches[-1] == [(0, [4], 3, 1), (1, [17, 18, 19], 7, 1), (2, [30, 31, 32, 33], 0, 0)]
    engine.step()
    assert rt.batches[-1] == [(0, [5], 4, 1), (1, [20], 10, 1), (2, [34], 4, 1)]


def test_prefix_reuse_picks_the_slot_with_the_longest_shared_prefix() -> None:
    engine, rt = make_engine(n_slots=3)
    submit(engine, "x", [1, 2, 3, 4, 5, 6], max_tokens=1)
    submit(engine, "y", [40, 41, 42], max_tokens=1)
    run_all(engine)
    slot_of_x = next(s for s in engine.scheduler.pool.slots if s.cached_ids[:1] == [1])
    ev = submit(engine, "z", [1, 2, 3, 4, 9], max_tokens=1)
    engine.step()
    assert rt.batches[-1] == [(slot_of_x.id, [9], 4, 1)]
    assert ev[-1].usage.cached_tokens == 4
    assert slot_of_x.cached_ids == [1, 2, 3, 4, 9]


def test_identical_prompt_recomputes_only_the_last_token() -> None:
    engine, rt = make_engine(n_slots=1)
    submit(engine, "x", [1, 2, 3], max_tokens=1)
    run_all(engine)
    ev = submit(engine, "y", [1, 2, 3], max_tokens=1)
    run_all(engine)
    assert rt.batches[-1] == [(0, [3], 2, 1)]
    assert ev[-1].usage.cached_tokens == 2


def test_cancel_frees_the_slot_and_the_next_queued_request_starts() -> None:
    engine, rt = make_engine(n_slots=1)
    first = submit(engine, "long", [1], max_tokens=40)
    second = submit(engine, "next", [30, 31], max_tokens=3)
    engine.step()
    engine.step()
    engine.cancel("long")
    engine.step()
    slot = engine.scheduler.pool.slots[0]
    assert first[-1].finish_reason is FinishReason.CANCELLED
    assert slot.seq is not None and slot.seq.request_id == "next"
    run_all(engine)
    assert second[-1].finish_reason is FinishReason.LENGTH
    assert slot.state is SlotState.IDLE


def test_cancel_of_a_queued_request() -> None:
    engine, _ = make_engine(n_slots=1)
    submit(engine, "a", [1], max_tokens=5)
    queued = submit(engine, "b", [2], max_tokens=5)
    engine.cancel("b")
    run_all(engine)
    assert [e.finish_reason for e in queued] == [FinishReason.CANCELLED]


def test_queue_bound() -> None:
    engine, _ = make_engine(n_slots=1, max_queue=1)
    submit(engine, "a", [1])
    engine.step()
    submit(engine, "b", [1])
    with pytest.raises(QueueFullError, match="1 generations waiting"):
        submit(engine, "c", [1])


def test_prompt_must_fit_a_slot() -> None:
    engine, _ = make_engine(n_ctx=16)
    with pytest.raises(PromptTooLongError, match="the prompt has 16 tokens but a slot's context holds 16"):
        submit(engine, "a", list(range(1, 17)))
    with pytest.raises(PromptTooLongError, match="empty"):
        submit(engine, "a", [])


def test_generation_stops_at_the_slot_context_limit() -> None:
    engine, _ = make_engine(n_slots=1, n_ctx=8)
    ev = submit(engine, "a", [1, 2, 3], max_tokens=100)
    run_all(engine)
    assert ev[-1].finish_reason is FinishReason.LENGTH
    assert ev[-1].usage.completion_tokens == 5  # 3 prompt + 5 generated fill the 8 positions


def test_eog_token_ends_with_stop_and_is_not_emitted() -> None:
    engine, _ = make_engine(n_slots=1)
    ev = submit(engine, "a", [47], max_tokens=10)
    run_all(engine)
    assert [e.token_ids for e in ev] == [(48,), (49,), ()]
    assert ev[-1].finish_reason is FinishReason.STOP


# -- prefix cache across slots ------------------------------------------------------------

def long_prompt(tag: int, n: int = 100) -> list[int]:
    return [(tag * 7 + i) % 40 + 1 for i in range(n)]


def test_a_placement_whose_kv_setup_fails_leaves_the_request_to_the_steps_failure() -> None:
    """kv_remove raising while a prompt is placed (a checkpoint that would not restore): the step
    fails, and the engine thread's fail_all ends that request too, with the error."""
    engine, rt = make_engine(n_slots=1)
    submit(engine, "x", [1, 2, 3, 4, 5, 6], max_tokens=1)
    run_all(engine)
    ev = submit(engine, "y", [1, 2, 3, 9], max_tokens=1)

    clear = rt.kv_remove

    def broken(seq_id: int, p0: int = 0, p1: int = -1) -> bool:  # (clearing a whole sequence still works)
        if p0 > 0:
            raise RuntimeError("llama_state_seq_set_data_ext failed")
        return clear(seq_id, p0, p1)

    rt.kv_remove = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="set_data_ext"):
        engine.step()
    assert [s.request_id for s in engine.scheduler.waiting] == ["y"]
    assert engine.scheduler.pool.slots[0].seq is None
    engine.scheduler.fail_all("internal error: llama_state_seq_set_data_ext failed")
    assert ev[-1].finish_reason == FinishReason.ERROR and "set_data_ext" in ev[-1].error
    assert not engine.has_work
    slot = engine.scheduler.pool.slots[0]  # emptied: its KV is no longer what it listed
    assert slot.cached_ids == [] and rt.kv[0] == [] and slot.seq is None


def test_prefix_held_by_a_busy_slot_is_copied_into_a_free_one() -> None:
    engine, rt = make_engine(n_slots=2, n_batch=256)
    system = long_prompt(1)
    submit(engine, "busy", system + [45], max_tokens=30)
    engine.step()
    engine.step()  # "busy" is generating in slot 0
    ev = submit(engine, "next", system + [46, 47], max_tokens=2)
    engine.step()
    assert rt.copies == [(0, 1)]
    assert rt.batches[-1][-1] == (1, [46, 47], 100, 1)  # only the new suffix is computed
    assert engine.scheduler.pool.slots[0].seq.request_id == "busy"  # the source keeps generating
    run_all(engine)
    assert ev[-1].usage.cached_tokens == 100


def test_a_prefix_a_sliding_window_let_go_of_is_computed_again_or_from_its_checkpoint() -> None:
    """A slot whose sliding-window layers no longer hold what follows its prefix recomputes the
    prompt from its first token, in its own slot or copied; or from its last prompt's end, where the
    runtime kept the window's state (a checkpoint) and the new prompt shares that much."""
    engine, rt = make_engine(n_slots=1)
    submit(engine, "x", [1, 2, 3, 4, 5, 6], max_tokens=1)
    run_all(engine)
    rt.forgotten.add(0)
    ev = submit(engine, "y", [1, 2, 3, 4, 9], max_tokens=1)
    run_all(engine)
    assert rt.batches[-1] == [(0, [1, 2, 3, 4, 9], 0, 1)]
    assert ev[-1].usage.cached_tokens == 0

    engine, rt = make_engine(n_slots=2, n_batch=256)
    system = long_prompt(1)
    submit(engine, "busy", system + [45], max_tokens=30)
    engine.step()
    engine.step()
    rt.forgotten.add(0)
    ev = submit(engine, "next", system + [46, 47], max_tokens=2)
    engine.step()
    assert rt.copies == []  # nothing worth copying
    assert rt.batches[-1][-1] == (1, system + [46, 47], 0, 1)
    run_all(engine)
    assert ev[-1].usage.cached_tokens == 0

    engine, rt = make_engine(n_slots=2, n_batch=256)  # a checkpoint does not restore into a copy
    submit(engine, "busy", system + [45], max_tokens=30)
    engine.step()
    engine.step()
    assert rt.checkpoints == {0: 101}
    rt.forgotten.add(0)
    ev = submit(engine, "next", system + [45, 47], max_tokens=2)  # (it shares the whole checkpointed prompt)
    engine.step()
    assert rt.copies == [] and rt.batches[-1][-1] == (1, system + [45, 47], 0, 1)
    run_all(engine)
    assert ev[-1].usage.cached_tokens == 0

    engine, rt = make_engine(n_slots=1)
    submit(engine, "x", [1, 2, 3, 4, 5, 6], max_tokens=3)  # the KV: the prompt, then 7 and 8
    run_all(engine)
    assert rt.checkpoints == {0: 6}
    rt.forgotten.add(0)
    ev = submit(engine, "y", [1, 2, 3, 4, 5, 6, 7, 30], max_tokens=1)
    run_all(engine)
    assert rt.batches[-1] == [(0, [7, 30], 6, 1)]
    assert ev[-1].usage.cached_tokens == 6


def test_short_shared_prefix_is_recomputed_not_copied() -> None:
    engine, rt = make_engine(n_slots=2)
    submit(engine, "a", [1, 2, 3, 4, 5, 6], max_tokens=20)
    engine.step()
    ev = submit(engine, "b", [1, 2, 3, 4, 9], max_tokens=1)
    run_all(engine)
    assert rt.copies == []
    assert ev[-1].usage.cached_tokens == 0


def test_alternating_prefixes_stay_cached_and_lru_idle_prefix_is_evicted_first() -> None:
    engine, rt = make_engine(n_slots=2, n_batch=256)
    a, b, c = long_prompt(1), long_prompt(2), long_prompt(3)
    for prompt, question in [(a, 41), (b, 42), (a, 43), (b, 44)]:
        ev = submit(engine, f"q{question}", prompt + [question], max_tokens=1)
        run_all(engine)
    assert ev[-1].usage.cached_tokens == 100  # both prefixes stayed cached while alternating
    holders = {tuple(s.cached_ids[:100]): s.id for s in engine.scheduler.pool.slots}
    assert set(holders) == {tuple(a), tuple(b)}
    # a third prefix under pressure evicts the least recently used idle one: a (used before b)
    submit(engine, "c", c + [45], max_tokens=1)
    run_all(engine)
    kept = {tuple(s.cached_ids[:100]) for s in engine.scheduler.pool.slots}
    assert kept == {tuple(b), tuple(c)}


def test_block_hashes_never_replace_the_token_check() -> None:
    from runner.scheduler.slots import Slot

    slot = Slot(0)
    slot.append(long_prompt(1, 130))
    other = tuple(long_prompt(1, 130)[:70] + [0] * 60)
    from runner.scheduler.slots import block_hashes

    assert slot.prefix_len(other, block_hashes(other)) == 70
    slot.truncate(65)
    assert slot.cached_ids == long_prompt(1, 65)
    slot.append([5] * 70)
    assert slot.prefix_len(tuple(slot.cached_ids), block_hashes(slot.cached_ids)) == 135


def test_a_new_request_fills_the_gap_between_busy_slots() -> None:
    # llama.cpp decodes a run of consecutive slot ids as one graph run; a gap costs a second one
    engine, rt = make_engine(n_slots=5)
    for i, max_tokens in enumerate([30, 2, 30, 30]):
        submit(engine, f"r{i}", [10 + i, 20 + i], max_tokens=max_tokens)
    engine.step()
    assert [s.seq.request_id if s.seq else None for s in engine.scheduler.pool.slots] == ["r0", "r1", "r2", "r3", None]
    while engine.scheduler.pool.slots[1].seq is not None:
        engine.step()
    submit(engine, "new", [50, 51], max_tokens=2)  # slot 4 is empty, slot 1 idle between busy ones
    engine.step()
    assert engine.scheduler.pool.slots[1].seq.request_id == "new"
    assert engine.scheduler.pool.slots[4].seq is None


def test_a_request_whose_sampling_raises_fails_alone() -> None:
    engine, rt = make_engine(n_slots=2)
    bad = submit(engine, "bad", [10, 11], max_tokens=5)
    good = submit(engine, "good", [20, 21], max_tokens=5)
    engine.step()  # both prefilled; now break the first one's sampling
    seq = engine.scheduler.pool.slots[0].seq
    assert seq is not None and seq.request_id == "bad"

    def broken(*args, **kwargs):
        raise ValueError("probabilities contain NaN")

    seq.take_tokens = broken
    run_all(engine)
    assert bad[-1].finish_reason is FinishReason.ERROR and "NaN" in bad[-1].error
    assert good[-1].finish_reason is FinishReason.LENGTH
    assert [t for e in good for t in e.token_ids] == [22, 23, 24, 25, 26]
    assert [s.state for s in engine.scheduler.pool.slots] == [SlotState.IDLE, SlotState.IDLE]
    assert rt.kv.get(0, []) == []  # the failed slot's KV is not trusted


def _plans_of_prompts(engine: Engine, rt: FakeRuntime, n_steps: int) -> list[list[int]]:
    """Per step, the slots whose prompt rows it carried."""
    out = []
    for _ in range(n_steps):
        engine.step()
        out.append([seq for seq, tokens, pos, _ in rt.batches[-1] if pos == 0 and len(tokens) > 1])
    return out


def test_where_steps_cost_per_token_prompts_are_prefilled_one_at_a_time_shortest_first() -> None:
    engine, rt = make_engine(n_slots=3, n_batch=64)
    for n, seconds in ((1, 0.009), (8, 0.037), (64, 0.261)):  # a small model on a CPU: 5 ms + 4 ms a token
        engine.scheduler.step_times.observe(n, seconds)
    submit(engine, "long", list(range(100, 130)), max_tokens=8)
    submit(engine, "short", list(range(200, 210)), max_tokens=8)
    submit(engine, "mid", list(range(300, 320)), max_tokens=8)
    assert _plans_of_prompts(engine, rt, 3) == [[1], [2], [0]]  # 10, then 20, then 30 tokens
    # each prompt's step carries the decode rows of the ones before it
    assert [seq for seq, *_ in rt.batches[-1]] == [1, 2, 0]


def test_where_steps_cost_mostly_a_fixed_time_prompts_share_a_step() -> None:
    engine, rt = make_engine(n_slots=3, n_batch=64)
    for n, seconds in ((1, 0.0200), (64, 0.0213)):  # a GPU: 20 ms a step, 0.02 ms a token
        engine.scheduler.step_times.observe(n, seconds)
    for i, n in enumerate((30, 10, 20)):
        submit(engine, f"r{i}", list(range(100 * (i + 1), 100 * (i + 1) + n)))
    assert _plans_of_prompts(engine, rt, 1) == [[1, 2, 0]]  # (shortest first)


def test_until_step_times_are_known_prompts_share_a_step_in_arrival_order() -> None:
    engine, rt = make_engine(n_slots=3, n_batch=64)
    for i, n in enumerate((30, 10, 20)):
        submit(engine, f"r{i}", list(range(100 * (i + 1), 100 * (i + 1) + n)))
    assert _plans_of_prompts(engine, rt, 1) == [[0, 1, 2]]


def test_a_long_prompt_passed_over_four_times_goes_first() -> None:
    engine, rt = make_engine(n_slots=2, n_batch=64)
    for n, seconds in ((1, 0.009), (8, 0.037), (64, 0.261)):
        engine.scheduler.step_times.observe(n, seconds)
    submit(engine, "long", list(range(100, 140)), max_tokens=8)
    firsts = []
    for i in range(5):  # a short prompt arrives before every step: without the limit, "long" would wait forever
        submit(engine, f"s{i}", [500 + i, 600 + i], max_tokens=1)
        engine.step()
        firsts.append([seq for seq, tokens, pos, _ in rt.batches[-1] if pos == 0])
    slot_of_long = next(s.id for s in engine.scheduler.pool.slots if s.seq is not None and s.seq.request_id == "long")
    assert [slot_of_long in f for f in firsts] == [False, False, False, False, True]


def test_each_row_is_planned_as_its_kind_and_taken_by_it() -> None:
    from runner.scheduler.batch import RowKind
    from runner.scheduler.scheduler import Scheduler
    from runner.scheduler.sequence import Sequence

    rt = FakeRuntime()
    scheduler = Scheduler(3, 128, 8, 8, rt)  # no step times yet: prompts share a step in arrival order
    events: dict[str, list[StreamEvent]] = {"a": [], "b": [], "c": []}
    for request in (GenerationRequest("a", (1, 2), GREEDY, 5), GenerationRequest("b", tuple(range(10, 20)), GREEDY, 5),
                    GenerationRequest("c", (30, 31), GREEDY, 0, prompt_logprobs=0)):  # c: scored, not generated
        scheduler.submit(Sequence(request, events[request.request_id].append, rt.token_bytes, rt.eog_ids))

    def step() -> list[tuple[int, RowKind]]:
        plan = scheduler.schedule()
        scheduler.postprocess(plan, rt.decode(plan.rows))
        return [(row.slot.id, row.kind) for row in plan.rows]

    assert step() == [(0, RowKind.PROMPT_END), (1, RowKind.PROMPT)]  # b's first 6 tokens: the budget is 8
    assert step() == [(0, RowKind.NEXT_TOKEN), (1, RowKind.PROMPT_END), (2, RowKind.PROMPT_ONLY)]
    assert step() == [(0, RowKind.NEXT_TOKEN), (1, RowKind.NEXT_TOKEN)]
    assert [e.token_ids for e in events["a"]] == [(3,), (4,), (5,)]
    assert [e.token_ids for e in events["b"]] == [(20,), (21,)]
    assert [(e.token_ids, e.finish_reason, [lp.token_id for lp in e.prompt_logprobs]) for e in events["c"]] == [
        ((), FinishReason.LENGTH, [31])]
