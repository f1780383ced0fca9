"""The pure step-cost model auto prices steps with."""

from __future__ import annotations

import pytest

from runner.runtime.micro_batches import Row
from runner.speculation.cost_model import CostTable, ShapeCosts


def test_step_cost_of_a_batch_is_the_sum_of_its_micro_batches() -> None:
    costs = ShapeCosts({1: CostTable((1, 8), (0.010, 0.024)), 4: CostTable((1, 8), (0.020, 0.090))})
    assert costs.micro_batch_s(4, 1) == 0.020
    assert costs.micro_batch_s(2, 1) == pytest.approx(0.010 + (0.020 - 0.010) / 3)  # between 1 and 4 sequences
    assert costs.micro_batch_s(8, 1) == pytest.approx(0.020 + 0.070 / 7)  # above 4: 4 sequences, same total tokens
    assert costs.batch_s([Row(0, 1), Row(1, 1)], 512) == pytest.approx(costs.micro_batch_s(2, 1))
    assert costs.batch_s([Row(0, 1), Row(2, 1)], 512) == pytest.approx(0.020)  # a gap: two graph runs
    assert costs.batch_s([Row(1, 3), Row(0, 1)], 512) == pytest.approx(costs.micro_batch_s(2, 1) + 0.012)
    assert costs.batch_s([Row(0, 1, 1)], 512, pads=True) == pytest.approx(0.012)  # padded to two tokens
