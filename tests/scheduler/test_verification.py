"""Verification on hand-made rows: the target's own token at each position, with drafts or without."""

from __future__ import annotations

import math

import numpy as np
import pytest

from runner.sampling.params import SamplingParams
from runner.sampling.sampler import Distribution, Sampler
from runner.scheduler.verification import verify

V = 6


def row(probs: list[float]) -> np.ndarray:
    """A logits row whose softmax is `probs` (zeros become very unlikely)."""
    p = np.array(probs, dtype=np.float64)
    return np.log(np.maximum(p, 1e-12)).astype(np.float32)


def chi2_critical(df: int, z: float = 2.326) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z = 2.326: p = 0.01)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


SAMPLED = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=5)


def test_greedy_accepts_the_matching_prefix_then_takes_the_target_token() -> None:
    rows = np.stack([row([0, 0.9, 0.1, 0, 0, 0]), row([0, 0, 0, 0.8, 0.2, 0]), row([0.7, 0, 0, 0, 0, 0.3])])
    v = verify(Sampler(SamplingParams(temperature=0)), rows, [1, 4], 0)
    assert (v.committed_ids, v.n_accepted) == ([1, 3], 1)
    v = verify(Sampler(SamplingParams(temperature=0)), rows, [1, 3], 0)
    assert (v.committed_ids, v.n_accepted) == ([1, 3, 0], 2)  # all accepted: the bonus row decides


def test_a_sampled_position_commits_the_same_token_whatever_was_drafted() -> None:
    """The seeded reply does not depend on speculation: at every position the committed token is
    the target's own draw for it, drafted or not (the rejection rule's draws depended on how many
    drafts came before: same seed, other replies with drafts on)."""
    rows = np.stack([row([0.05, 0.15, 0.4, 0.1, 0.2, 0.1]), row([0.3, 0.1, 0.1, 0.2, 0.2, 0.1])])
    for pos in range(300):
        plain = Sampler(SAMPLED)
        own = plain.draw(plain.distribution(rows[0]), pos)
        for draft in range(V):
            v = verify(Sampler(SAMPLED), rows, [draft], pos)
            assert v.committed_ids[0] == own and v.n_accepted == (draft == own)
            if draft == own:  # the bonus token is the next position's own draw
                assert v.committed_ids[1] == plain.draw(plain.distribution(rows[1]), pos + 1)


def test_a_draft_is_accepted_with_the_targets_probability_and_commits_follow_the_target() -> None:
    p = [0.05, 0.15, 0.4, 0.1, 0.2, 0.1]
    rows = np.stack([row(p), row([1 / V] * V)])
    sampler = Sampler(SAMPLED)
    n = 6000
    counts = np.zeros(V)
    accepted = 0
    for pos in range(n):
        v = verify(sampler, rows, [2], pos)
        accepted += v.n_accepted
        counts[v.committed_ids[0]] += 1
    assert accepted / n == pytest.approx(0.4, abs=0.03)
    expected = np.array(p) * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < chi2_critical(V - 1), (counts, expected)


def test_close_distributions_drawn_with_one_key_agree_where_they_overlap() -> None:
    """A draft model draws with the target's seed and position (draft_samplers): two distributions
    that differ by a little give the same token nearly always (independent draws: 0.3 here)."""
    p = Distribution(np.array([0, 1, 2]), np.array([0.5, 0.3, 0.2]))
    q = Distribution(np.array([0, 1, 2]), np.array([0.45, 0.35, 0.2]))
    a, b = Sampler(SAMPLED), Sampler(SAMPLED)
    same = sum(a.draw(p, pos) == b.draw(q, pos) for pos in range(4000)) / 4000
    assert same == pytest.approx(0.95, abs=0.02)  # 1 - the total variation distance (0.05)


def test_penalties_see_accepted_drafts_before_the_next_row() -> None:
    # with a strong presence penalty, token 1 accepted at row 0 must lose at row 1
    params = SamplingParams(temperature=0, presence_penalty=2.0)
    rows = np.stack([row([0.1, 0.8, 0.1, 0, 0, 0]), row([0.05, 0.6, 0.35, 0, 0, 0])])
    v = verify(Sampler(params), rows, [1], 0)
    assert v.committed_ids == [1, 2]
