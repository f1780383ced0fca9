"""llama.cpp's micro-batch split as we model it, the padding that keeps kernels batch-invariant,
and the ModelRunner applying it on the tiny model (F32 weights: not batch-invariant on x86)."""

from __future__ import annotations

import numpy as np
import pytest

from runner.llama import ContextShape, Model
from runner.micro_batches import Piece, Row, pad, split
from runner.model_runner import ModelRunner
from runner.scheduler import BatchRow
from runner.slots import Slot


def shapes(rows: list[Row], n_ubatch: int = 512) -> list[list[tuple[int, int, int]]]:
    return [[(p.row, p.start, p.n) for p in mb] for mb in split(rows, n_ubatch)]


def test_consecutive_slots_share_one_micro_batch_and_gaps_split_it() -> None:
    assert shapes([Row(0, 1), Row(1, 1), Row(2, 1), Row(3, 1)]) == [[(0, 0, 1), (1, 0, 1), (2, 0, 1), (3, 0, 1)]]
    assert len(split([Row(0, 1), Row(2, 1), Row(4, 1), Row(6, 1)], 512)) == 4
    assert len(split([Row(3, 1), Row(2, 1), Row(1, 1), Row(0, 1)], 512)) == 4  # ids must count up in batch order
    assert shapes([Row(2, 1), Row(0, 1), Row(1, 1)]) == [[(0, 0, 1)], [(1, 0, 1), (2, 0, 1)]]


def test_unequal_rows_run_in_lockstep_then_alone() -> None:
    assert shapes([Row(0, 5), Row(1, 1), Row(2, 1), Row(3, 1)]) == [
        [(0, 0, 1), (1, 0, 1), (2, 0, 1), (3, 0, 1)], [(0, 1, 4)]]
    # a sequence that ran out ends the run: rows 0 and 2 are no longer neighbours
    assert shapes([Row(0, 2), Row(1, 1), Row(2, 2)]) == [[(0, 0, 1), (1, 0, 1), (2, 0, 1)], [(0, 1, 1)], [(2, 1, 1)]]
    assert shapes([Row(0, 600)]) == [[(0, 0, 512)], [(0, 512, 88)]]
    assert shapes([Row(0, 300), Row(1, 300)]) == [[(0, 0, 256), (1, 0, 256)], [(0, 256, 44), (1, 256, 44)]]
    assert split([Row(0, 3)], 512) == [[Piece(0, 0, 3)]]


def test_padding_widens_lone_tokens_and_lone_logits_rows() -> None:
    one = pad([Row(0, 1, 1)], 512)
    assert one.junk == [1] and one.extra_logits == [[1]]  # decode row + junk, junk's logits too
    mixed = pad([Row(0, 2, 2), Row(1, 1, 1)], 512)  # a verify row's last token would run alone
    assert mixed.junk == [1, 0] and mixed.extra_logits == [[2], []]
    prefill = pad([Row(0, 10, 1)], 512)  # ten tokens, one logits row
    assert prefill.junk == [0] and prefill.extra_logits == [[0]]
    assert pad([Row(0, 1, 1), Row(1, 1, 1)], 512).is_empty
    assert pad([Row(0, 3, 3), Row(1, 3, 1), Row(2, 3, 0)], 512).is_empty
    full = pad([Row(0, 1, 1)], 512, room=[0])  # the context's last position: nowhere to put junk
    assert full.junk == [0] and full.extra_logits == [[]]
    gaps = [Row(0, 1, 1), Row(2, 1, 1), Row(4, 1, 1)]  # three lone tokens
    assert pad(gaps, 512).junk == [1, 1, 1]
    assert pad(gaps, 512, max_junk=2).junk == [1, 1, 0]  # the batch holds two more tokens, no more
    assert pad(gaps, 512, max_junk=0).junk == [0, 0, 0]


def test_a_full_step_still_gets_its_junk_token(tiny_model: Model) -> None:
    """A step of n_batch tokens with a lone decode row: the junk token goes past n_batch (regression:
    the batch overflowed and the step failed with every request in it)."""
    shape = ContextShape(n_seq=4, n_ctx_per_seq=64, n_batch=16, n_threads=2, kv_unified=False, n_junk_max=4)
    runner = ModelRunner(tiny_model, shape)
    try:
        runner.decode(rows_for([(0, [5, 9, 14, 3], 0, 1)]))
        alone = runner.decode(rows_for([(0, [20], 4, 1)]))[0].copy()
        runner.kv_remove(0, 4, -1)
        full = rows_for([(0, [20], 4, 1), (2, list(range(30, 45)), 0, 1)])  # 1 + 15 = n_batch, slot 1 a gap
        logits = runner.decode(full)
        assert runner._batch.n_tokens == 17
        assert np.array_equal(logits[full[0].first_logit], alone)
    finally:
        runner.close()


@pytest.fixture
def runner(tiny_model: Model):
    r = ModelRunner(tiny_model, ContextShape(n_seq=4, n_ctx_per_seq=64, n_batch=64, n_threads=2, kv_unified=False))
    yield r
    r.close()


def rows_for(spec: list[tuple[int, list[int], int, int]]) -> list[BatchRow]:
    return [BatchRow(Slot(seq), tokens, pos, n_logits) for seq, tokens, pos, n_logits in spec]


def test_a_token_gets_the_same_logits_alone_as_in_a_wide_batch(runner: ModelRunner) -> None:
    assert runner.pads_batches  # F32 weights use tinyBLAS only for two or more columns
    prompt = [5, 9, 14, 3, 7, 11]
    for seq in range(4):
        runner.decode(rows_for([(seq, prompt, 0, 1)]))
    alone = rows_for([(0, [20], 6, 1)])
    logits_alone = runner.decode(alone)[alone[0].first_logit].copy()
    assert runner.context.kv_pos_max(0) == 6  # the junk position is gone again
    runner.kv_remove(0, 6, -1)
    wide = rows_for([(2, [21], 6, 1), (0, [20, 30, 31], 6, 3), (1, [22], 6, 1)])  # out of slot order on purpose
    logits_wide = runner.decode(wide)
    assert np.array_equal(logits_wide[wide[1].first_logit], logits_alone)
    assert [r.first_logit for r in wide] == [4, 0, 3]  # rows are laid out in slot order: 0, 1, 2
    assert [runner.context.kv_pos_max(s) for s in range(4)] == [8, 6, 6, 5]


def test_without_padding_the_tiny_model_would_differ(runner: ModelRunner) -> None:
    runner.pads_batches = False  # what the probe guards against
    runner.decode(rows_for([(0, [5, 9, 14], 0, 1)]))
    alone = runner.decode(rows_for([(0, [20], 3, 1)]))[0].copy()
    runner.kv_remove(0, 3, -1)
    pair = runner.decode(rows_for([(0, [20, 21], 3, 2)]))[0]
    assert not np.array_equal(alone, pair)


def test_step_cost_of_a_batch_is_the_sum_of_its_micro_batches() -> None:
    from runner.step_costs import CostTable, ShapeCosts

    costs = ShapeCosts({1: CostTable((1, 8), (0.010, 0.024)), 4: CostTable((1, 8), (0.020, 0.090))})
    assert costs.micro_batch_s(4, 1) == 0.020
    assert costs.micro_batch_s(2, 1) == pytest.approx(0.010 + (0.020 - 0.010) / 3)  # between 1 and 4 sequences
    assert costs.micro_batch_s(8, 1) == pytest.approx(0.020 + 0.070 / 7)  # above 4: 4 sequences, same total tokens
    assert costs.batch_s([Row(0, 1), Row(1, 1)], 512) == pytest.approx(costs.micro_batch_s(2, 1))
    assert costs.batch_s([Row(0, 1), Row(2, 1)], 512) == pytest.approx(0.020)  # a gap: two graph runs
    assert costs.batch_s([Row(1, 3), Row(0, 1)], 512) == pytest.approx(costs.micro_batch_s(2, 1) + 0.012)
    assert costs.batch_s([Row(0, 1, 1)], 512, pads=True) == pytest.approx(0.012)  # padded to two tokens


def test_batch_invariant_off_turns_the_padding_off(tiny_gguf) -> None:
    from runner.loaded_model import LoadedModel
    from runner.options import EngineOptions

    for setting, pads in (("auto", True), ("off", False)):
        loaded = LoadedModel(tiny_gguf, EngineOptions(parallel=2, ctx_size=64, batch_size=32, batch_invariant=setting),
                             log=lambda _: None)
        try:
            assert loaded.runner.pads_batches is pads
            assert loaded.runner.context.shape.n_batch_max == (34 if pads else 32)  # a junk token per slot
        finally:
            loaded.close()


def test_load_time_decodes_leave_no_openmp_team_behind(tiny_model: Model) -> None:
    # llama.cpp's OpenMP keeps worker threads for every thread that decoded; a second team next
    # to the engine thread's made every later decode slower, so the probe runs on a scratch thread
    import os
    import time

    def n_threads() -> int:
        return len(os.listdir("/proc/self/task"))

    before = n_threads()
    r = ModelRunner(tiny_model, ContextShape(n_seq=2, n_ctx_per_seq=64, n_batch=64, n_threads=2, kv_unified=False))
    try:
        assert r.pads_batches  # the probe did decode
        deadline = time.monotonic() + 5  # the team's workers exit shortly after their thread
        while n_threads() > before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert n_threads() == before
    finally:
        r.close()


def test_the_batch_trace_records_each_decode_and_kv_edit(tiny_model: Model, tmp_path, monkeypatch) -> None:
    import json

    from runner.model_runner import TRACE_ENV

    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv(TRACE_ENV, str(trace))
    runner = ModelRunner(tiny_model, ContextShape(n_seq=2, n_ctx_per_seq=64, n_batch=64, n_threads=2, kv_unified=False,
                                                  n_junk_max=2))
    try:
        runner.decode(rows_for([(1, [5, 9, 14], 0, 1)]))
        runner.kv_remove(1, 2, -1)
    finally:
        runner.close()
    ops = [json.loads(line) for line in trace.read_text().splitlines()]
    assert ops[0] == ["decode", [[1, [5, 9, 14], 0, [0, 2]]]]  # padded: a second logits row
    assert ops[-1] == ["kv_remove", [1, 2, -1]]


def test_a_thread_that_has_decoded_runs_load_time_decodes_itself(tiny_model: Model) -> None:
    # a second team beside the one such a thread keeps would slow both (and skew calibration)
    import threading

    from runner.llama import Batch, Context, in_scratch_thread

    seen: dict[str, tuple[int, int]] = {}

    def body() -> None:
        me = threading.get_ident()
        seen["before"] = (me, in_scratch_thread(threading.get_ident))
        ctx = Context(tiny_model, ContextShape(n_seq=1, n_ctx_per_seq=16, n_batch=16, n_threads=2))
        try:
            batch = Batch(16)
            batch.add(0, [1, 2], 0, 1)
            ctx.decode(batch)
        finally:
            ctx.close()
        seen["after"] = (me, in_scratch_thread(threading.get_ident))

    thread = threading.Thread(target=body)  # a fresh thread: nothing decoded on it yet
    thread.start()
    thread.join()
    me, ran_on = seen["before"]
    assert ran_on != me  # no team yet: the work goes to a scratch thread
    me, ran_on = seen["after"]
    assert ran_on == me
