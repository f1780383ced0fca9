"""Lossless verification of drafted tokens against the target's logits rows.

Row i of the target's logits predicts the token after the i-th fed token, so with drafts
d1..dk fed after the slot's next token, row i judges d(i+1) and row k gives a bonus token.
Greedy: accept while the target's argmax equals the draft. Sampling: the standard rejection
rule, so the committed tokens are distributed exactly as plain sampling from the target.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runner.sampling.sampler import Distribution, Sampler


@dataclass(frozen=True)
class Verdict:
    committed_ids: list[int]  # accepted drafts, then the target's own token
    n_accepted: int  # how many leading committed_ids are accepted drafts


def _prob_of(dist: Distribution, token_id: int) -> float:
    hit = np.flatnonzero(dist.token_ids == token_id)
    return float(dist.probs[hit[0]]) if len(hit) else 0.0


def residual(p: Distribution, q: Distribution) -> Distribution:
    """normalize(max(0, p - q)): where the target wants more mass than the draft gave."""
    ids = np.union1d(p.token_ids, q.token_ids)
    pv = np.zeros(len(ids))
    qv = np.zeros(len(ids))
    pv[np.searchsorted(ids, p.token_ids)] = p.probs
    qv[np.searchsorted(ids, q.token_ids)] = q.probs
    r = np.maximum(pv - qv, 0.0)
    total = r.sum()
    if total <= 0.0:  # only by rounding: p == q, so sampling from p is exact
        return p
    keep = r > 0
    return Distribution(ids[keep], r[keep] / total)


def point_mass(token_id: int) -> Distribution:
    return Distribution(np.array([token_id]), np.array([1.0]))


def verify(sampler: Sampler, rows: np.ndarray, draft_ids: list[int], draft_dists: list[Distribution | None]) -> Verdict:
    """Decide which drafts the target keeps, and its own next token. Updates the sampler's history."""
    if sampler.params.is_greedy:
        return _verify_greedy(sampler, rows, draft_ids)
    committed: list[int] = []
    for i, draft in enumerate(draft_ids):
        p = sampler.distribution(rows[i])
        q = draft_dists[i] or point_mass(draft)
        p_d, q_d = _prob_of(p, draft), _prob_of(q, draft)
        # accept with probability min(1, p/q); on rejection draw from normalize(max(0, p - q))
        if not (q_d > 0.0 and sampler.uniform() < min(1.0, p_d / q_d)):
            return Verdict(committed + [sampler.draw(residual(p, q))], i)
        committed.append(draft)
        sampler.accept(draft)
    bonus = sampler.distribution(rows[len(draft_ids)] if draft_ids else rows)  # (no drafts: the block is that row)
    token = int(bonus.token_ids[0]) if len(bonus.token_ids) == 1 else sampler.draw(bonus)
    return Verdict(committed + [token], len(draft_ids))


def _verify_greedy(sampler: Sampler, rows: np.ndarray, draft_ids: list[int]) -> Verdict:
    """Keep drafts while they are the target's argmax; then the target's own token."""
    for i, draft in enumerate(draft_ids):
        target = sampler.greedy_token(rows[i])
        if target != draft:
            return Verdict(draft_ids[:i] + [target], i)
        sampler.accept(draft)
    last = rows[len(draft_ids)] if draft_ids else rows  # (no drafts: the block is that one row)
    return Verdict(draft_ids + [sampler.greedy_token(last)], len(draft_ids))
