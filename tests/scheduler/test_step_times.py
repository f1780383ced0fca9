"""The step-time line the scheduler reads: fitted through size classes, not through every step."""

from __future__ import annotations

import pytest

from runner.scheduler.step_times import StepTimes


def test_the_line_through_steps_on_a_line_is_that_line() -> None:
    times = StepTimes()
    for n in (1, 8, 64, 8, 8, 8, 8):  # (many decode steps of one size do not outweigh the others)
        times.observe(n, 0.005 + 0.004 * n)
    line = times.line()
    assert line is not None
    assert line.fixed_s == pytest.approx(0.005)
    assert line.per_token_s == pytest.approx(0.004)


def test_no_line_until_two_sizes_are_known() -> None:
    times = StepTimes()
    times.observe(8, 0.04)
    times.observe(9, 0.05)  # the same size class (8-15)
    times.observe(0, 0.01)  # nothing decoded: ignored
    assert times.line() is None


def test_a_class_follows_its_recent_steps() -> None:
    times = StepTimes()
    times.observe(1, 0.010)
    times.observe(64, 0.200)
    for _ in range(50):  # the machine got busier: steps of 64 now take twice as long
        times.observe(64, 0.400)
    line = times.line()
    assert line is not None and line.per_token_s == pytest.approx((0.400 - 0.010) / 63, rel=1e-3)
