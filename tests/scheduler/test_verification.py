"""The acceptance math on hand-made rows: greedy prefix rule and the rejection rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from runner.sampling.params import SamplingParams
from runner.sampling.sampler import Distribution, Sampler
from runner.scheduler.verification import residual, verify

V = 6


def row(probs: list[float]) -> np.ndarray:
    """A logits row whose softmax is `probs` (zeros become very unlikely)."""
    p = np.array(probs, dtype=np.float64)
    return np.log(np.maximum(p, 1e-12)).astype(np.float32)


def dist(pairs: dict[int, float]) -> Distribution:
    ids = np.array(sorted(pairs))
    return Distribution(ids, np.array([pairs[i] for i in ids]))


def chi2_critical(df: int, z: float = 2.326) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z = 2.326: p = 0.01)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_residual_is_the_normalized_positive_part() -> None:
    r = residual(dist({1: 0.5, 2: 0.3, 3: 0.2}), dist({1: 0.8, 2: 0.2}))
    assert r.token_ids.tolist() == [2, 3]
    assert r.probs.tolist() == pytest.approx([1 / 3, 2 / 3])


def test_greedy_accepts_the_matching_prefix_then_takes_the_target_token() -> None:
    rows = np.stack([row([0, 0.9, 0.1, 0, 0, 0]), row([0, 0, 0, 0.8, 0.2, 0]), row([0.7, 0, 0, 0, 0, 0.3])])
    v = verify(Sampler(SamplingParams(temperature=0)), rows, [1, 4], [None, None])
    assert (v.committed_ids, v.n_accepted) == ([1, 3], 1)
    v = verify(Sampler(SamplingParams(temperature=0)), rows, [1, 3], [None, None])
    assert (v.committed_ids, v.n_accepted) == ([1, 3, 0], 2)  # all accepted: the bonus row decides


def test_point_mass_draft_is_accepted_with_probability_p() -> None:
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=5)
    rows = np.stack([row([0.1, 0.3, 0.6, 0, 0, 0]), row([1, 0, 0, 0, 0, 0])])
    sampler = Sampler(params)
    accepted = sum(verify(sampler, rows, [2], [None]).n_accepted for _ in range(4000))
    assert accepted / 4000 == pytest.approx(0.6, abs=0.03)


@pytest.mark.parametrize("q", [
    None,  # a drafter without probabilities: a point mass on its token
    {0: 0.5, 1: 0.4, 2: 0.1},  # a draft that disagrees with the target
    {2: 0.2, 3: 0.2, 4: 0.2, 5: 0.4},
])
def test_committed_token_follows_the_target_distribution(q: dict[int, float] | None) -> None:
    p = [0.05, 0.15, 0.4, 0.1, 0.2, 0.1]
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=11)
    rows = np.stack([row(p), row([1 / V] * V)])
    sampler = Sampler(params)
    draft_rng = np.random.default_rng(99)
    n = 6000
    counts = np.zeros(V)
    for _ in range(n):
        if q is None:
            d, qd = 2, None
        else:
            qd = dist(q)
            d = int(draft_rng.choice(qd.token_ids, p=qd.probs))
        counts[verify(sampler, rows, [d], [qd]).committed_ids[0]] += 1
    expected = np.array(p) * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < chi2_critical(V - 1), (counts, expected)


def test_penalties_see_accepted_drafts_before_the_next_row() -> None:
    # with a strong presence penalty, token 1 accepted at row 0 must lose at row 1
    params = SamplingParams(temperature=0, presence_penalty=2.0)
    rows = np.stack([row([0.1, 0.8, 0.1, 0, 0, 0]), row([0.05, 0.6, 0.35, 0, 0, 0])])
    v = verify(Sampler(params), rows, [1], [None])
    assert v.committed_ids == [1, 2]
