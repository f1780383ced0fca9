"""llama.cpp's micro-batch split as we model it, and the padding that keeps kernels batch-invariant
(test_model_runner applies it on the tiny model: F32 weights, not batch-invariant on x86)."""

from __future__ import annotations

from runner.runtime.micro_batches import Piece, Row, pad, split


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
