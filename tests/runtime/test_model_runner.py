"""The model runner: one batch per step in slot order, per-row logits, padding where kernels are not
batch-invariant, the batch trace."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

from runner.model.loaded_model import LoadedModel
from runner.config.options import EngineOptions
from runner.runtime.llama import ContextShape, Model
from runner.runtime.model_runner import TRACE_ENV, ModelRunner
from runner.scheduler.batch import BatchRow
from runner.scheduler.slots import Slot


def test_a_full_step_still_gets_its_junk_token(tiny_model: Model) -> None:
    """A step of n_batch tokens with a lone decode row: the junk token goes past n_batch (regression:
    the batch overflowed and the step failed with every request in it)."""
    shape = ContextShape(n_seq=4, n_ctx_per_seq=64, n_batch=16, n_threads=2, kv_unified=False, n_junk_max=4)
    runner = ModelRunner(tiny_model, shape)
    try:
        runner.decode(rows_for([(0, [5, 9, 14, 3], 0, 1)]))
        alone = runner.decode(rows_for([(0, [20], 4, 1)]))[0][0].copy()
        runner.kv_remove(0, 4, -1)
        full = rows_for([(0, [20], 4, 1), (2, list(range(30, 45)), 0, 1)])  # 1 + 15 = n_batch, slot 1 a gap
        logits = runner.decode(full)
        assert runner._batch.n_tokens == 17
        assert np.array_equal(logits[0][0], alone)
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
    logits_alone = runner.decode(alone)[0][0].copy()
    assert runner.context.kv_pos_max(0) == 6  # the junk position is gone again
    runner.kv_remove(0, 6, -1)
    wide = rows_for([(2, [21], 6, 1), (0, [20, 30, 31], 6, 3), (1, [22], 6, 1)])  # out of slot order on purpose
    logits_wide = runner.decode(wide)
    assert [len(rows) for rows in logits_wide] == [1, 3, 1]  # each row's logits, in the order given
    assert np.array_equal(logits_wide[1][0], logits_alone)
    assert not np.array_equal(logits_wide[0][0], logits_alone)
    assert [runner.context.kv_pos_max(s) for s in range(4)] == [8, 6, 6, 5]


def test_without_padding_the_tiny_model_would_differ(runner: ModelRunner) -> None:
    runner.pads_batches = False  # what the probe guards against
    runner.decode(rows_for([(0, [5, 9, 14], 0, 1)]))
    alone = runner.decode(rows_for([(0, [20], 3, 1)]))[0][0].copy()
    runner.kv_remove(0, 3, -1)
    pair = runner.decode(rows_for([(0, [20, 21], 3, 2)]))[0][0]
    assert not np.array_equal(alone, pair)


def test_batch_invariant_off_turns_the_padding_off(tiny_gguf) -> None:
    for setting, pads in (("on", True), ("off", False)):
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
    def n_threads() -> int:
        return len(os.listdir("/proc/self/task"))

    before = n_threads()
    r = ModelRunner(tiny_model, ContextShape(n_seq=2, n_ctx_per_seq=64, n_batch=64, n_threads=2, kv_unified=False))
    try:
        assert r.pads_batches  # the probe did decode
        deadline = time.monotonic() + 30  # the team's workers exit shortly after their thread (a loaded CI: more)
        while n_threads() > before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert n_threads() == before
    finally:
        r.close()


def test_the_batch_trace_records_each_decode_and_kv_edit(tiny_model: Model, tmp_path, monkeypatch) -> None:
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


def test_by_default_nothing_is_padded_and_with_the_option_the_padding_is_counted(tiny_gguf) -> None:
    from engines import submit_all
    from runner.sampling.params import SamplingParams
    from runner.scheduler.request import GenerationRequest

    counts = {}
    for setting in ("off", "on"):
        options = {} if setting == "off" else {"batch_invariant": "on"}
        loaded = LoadedModel(tiny_gguf, EngineOptions(parallel=2, ctx_size=64, batch_size=32, threads=2, **options),
                             log=lambda _: None)
        try:
            submit_all(loaded.engine, [GenerationRequest(f"r{i}", (5, 6, 7), SamplingParams(temperature=0), 8)
                                       for i in range(3)])
            counts[setting] = loaded.runner.n_padding_tokens
        finally:
            loaded.close()
    assert EngineOptions().batch_invariant == "off"
    assert counts["off"] == 0 and counts["on"] > 0
