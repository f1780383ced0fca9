"""auto's pieces on their own: the pure choice of k and each small state object."""

from __future__ import annotations

import pytest

from runner.speculation.auto_policy import (DECIDE_EVERY, EXPLORE_SHARE, Backoff, ProbeBudget, UnpricedTime,
                                            best_uniform_k, cheapest_probe, expected_tokens, probe_affordable)


def linear_price(per_token_s: float, fixed_s: float = 0.0):
    return lambda ks: fixed_s + per_token_s * sum(1 + k for k in ks.values())


def test_expected_tokens_counts_each_slot_once_plus_its_drafts_chances() -> None:
    gains = {0: [0.9, 0.81], 1: [0.5]}
    assert expected_tokens(gains, {0: 2, 1: 0}) == pytest.approx(2 + 0.9 + 0.81)


def test_drafts_are_taken_when_verifying_costs_little() -> None:
    gains = {0: [0.9, 0.8, 0.7, 0.6], 1: [0.9, 0.8]}
    ks = best_uniform_k(gains, linear_price(0.0001, fixed_s=0.010), room=64, k_max=4)
    assert ks == {0: 4, 1: 2}  # the same k for both, capped by what slot 1 has on offer


def test_no_drafts_when_each_token_costs_a_whole_step() -> None:
    gains = {0: [0.9, 0.8, 0.7, 0.6]}
    assert best_uniform_k(gains, linear_price(0.010), room=64, k_max=4) == {0: 0}


def test_the_batch_room_caps_k() -> None:
    gains = {0: [1.0] * 4, 1: [1.0] * 4}
    assert best_uniform_k(gains, linear_price(0.0001, fixed_s=0.010), room=5, k_max=4) == {0: 2, 1: 2}


def test_the_search_stops_once_deeper_drafts_cannot_win() -> None:
    priced = []

    def price(ks: dict[int, int]) -> float:
        priced.append(dict(ks))
        return 0.010 * (1 + ks[0]) ** 2  # dearer and dearer

    assert best_uniform_k({0: [0.5] * 8}, price, room=64, k_max=8) == {0: 0}
    # k=2 costs 0.09 s: even all 8 drafts accepted (5 tokens) would not beat plain steps' 100 tokens/s
    assert [p[0] for p in priced] == [0, 1, 2]


def first_token_dear(ks: dict[int, int]) -> float:
    """One row on F16 weights here: 10 ms for a token, 17 for two, then 0.5 ms a token more."""
    n = 1 + ks[0]
    return 0.010 if n == 1 else 0.017 + 0.0005 * (n - 2)


def test_the_probe_takes_the_k_with_the_least_time_per_draft() -> None:
    probe, extra_s = cheapest_probe({0: [0.3] * 4}, first_token_dear, plain_s=0.010, room=64)
    assert probe == {0: 4} and extra_s == pytest.approx(0.0085)  # 2.1 ms a draft, where one alone costs 7
    assert probe_affordable(probe, extra_s, plain_s=0.010, n_rows=1)
    assert not probe_affordable({0: 1}, 0.007, plain_s=0.010, n_rows=1)  # over half a step for one draft
    # a flat price per token: one draft is as cheap per draft as four, and adds the least to its step
    assert cheapest_probe({0: [0.3] * 4}, linear_price(0.001, fixed_s=0.010), 0.011, room=64)[0] == {0: 1}
    assert cheapest_probe({0: [0.3] * 4}, first_token_dear, 0.010, room=2)[0] == {0: 2}  # what fits the batch


def test_a_probe_that_splits_the_batch_must_be_cheaper_per_draft() -> None:
    """Two of four rows probing: extra graph runs, measured dearer than priced; each draft may add
    at most half of a row's share of the plain step."""
    plain_s = 0.018
    assert probe_affordable({0: 1, 1: 1, 2: 1, 3: 1}, 0.008, plain_s, n_rows=4)  # 2 ms a draft, rows 4.5 ms
    assert not probe_affordable({0: 1, 1: 1, 2: 0, 3: 0}, 0.017, plain_s, n_rows=4)  # 8.5 ms a draft
    assert not probe_affordable({0: 0}, 0.0, plain_s, n_rows=1)  # nothing to probe with


def test_the_probe_budget_earns_a_share_and_saves_up_one_probe_at_most() -> None:
    budget = ProbeBudget()
    for _ in range(1000):
        budget.earn(plain_s=0.010, probe_extra_s=0.004)
    assert budget.credit_s == pytest.approx(0.010)  # capped at max(probe, plain step)
    budget.pay(0.004)
    assert budget.credit_s == pytest.approx(0.006)
    assert ProbeBudget().credit_after(0.010, 0.004) == pytest.approx(EXPLORE_SHARE * 0.010)
    assert budget.last_plain_s == 0.010


def test_unpriced_time_is_a_plain_mean_of_a_shapes_first_steps_then_a_running_one() -> None:
    unpriced = UnpricedTime()
    unpriced.observe((4, 0), step_s=0.015, priced_s=0.010)
    assert unpriced.mean_s((4, 0)) == pytest.approx(0.005)
    unpriced.observe((4, 0), step_s=0.009, priced_s=0.010)  # faster than priced counts as zero
    assert unpriced.mean_s((4, 0)) == pytest.approx(0.0025)
    for _ in range(80):
        unpriced.observe((4, 0), step_s=0.011, priced_s=0.010)
    unpriced.observe((4, 0), step_s=0.021, priced_s=0.010)  # one slow step moves it by a tenth
    assert unpriced.mean_s((4, 0)) == pytest.approx(0.001 + 0.1 * 0.010, rel=0.01)


def test_unpriced_time_is_kept_by_shape_and_a_new_shape_takes_the_nearest_with_no_more_drafts() -> None:
    unpriced = UnpricedTime()
    unpriced.observe((8, 4), step_s=0.430, priced_s=0.290)
    assert unpriced.mean_s((8, 0)) == 0.0  # never the mean of a shape with more drafts: plain steps get tried
    unpriced.observe((8, 0), step_s=0.110, priced_s=0.105)
    unpriced.observe((1, 1), step_s=0.040, priced_s=0.038)
    assert unpriced.mean_s((8, 0)) == pytest.approx(0.005)
    assert unpriced.mean_s((8, 4)) == pytest.approx(0.140)
    assert unpriced.mean_s((8, 3)) == pytest.approx(0.005)  # same rows, the most drafts not above 3
    assert unpriced.mean_s((6, 4)) == pytest.approx(0.140)  # the nearest rows first
    assert unpriced.mean_s((2, 4)) == pytest.approx(0.002)
    assert unpriced.mean_s((1, 0)) == pytest.approx(0.005)  # (1, 1) has more drafts: the 8 rows' plain steps


def test_a_bet_on_a_shape_not_seen_yet_prices_its_shortfall_in_proportion() -> None:
    unpriced = UnpricedTime()
    assert unpriced.cautious_s((4, 2), priced_s=0.166) == 0.0
    unpriced.observe((4, 0), step_s=0.090, priced_s=0.076)
    assert unpriced.mean_s((4, 2)) == pytest.approx(0.014)  # a step's choice: the shortfall as it stood
    assert unpriced.cautious_s((4, 2), priced_s=0.166) == pytest.approx(0.014 * 0.166 / 0.076)
    assert unpriced.cautious_s((4, 0), priced_s=0.500) == pytest.approx(0.014)  # a seen shape: its own
    assert unpriced.cautious_s((4, 1), priced_s=0.010) == pytest.approx(0.014)  # never below as it stood
    unpriced.observe((4, 2), step_s=0.229, priced_s=0.166)
    assert unpriced.cautious_s((4, 2), priced_s=0.166) == pytest.approx(0.063)


def test_backoff_rests_the_same_rows_and_ends_for_others() -> None:
    backoff = Backoff()
    assert not backoff.take_rest(("a",))
    backoff.start(("a",))
    assert [backoff.take_rest(("a",)) for _ in range(DECIDE_EVERY)] == [True] * (DECIDE_EVERY - 1) + [False]
    backoff.start(("a",))
    assert not backoff.take_rest(("a", "b"))  # a new request: decide at once
    assert not backoff.take_rest(("a",))  # and the rest is over
