"""Verification of drafted tokens against the target's logits rows.

Row i of the target's logits predicts the token after the i-th fed token, so with drafts
d1..dk fed after the slot's next token, row i judges d(i+1) and row k gives a bonus token.
At each position the target decides its own token as it would without drafts (greedy: the
argmax; sampling: its draw for that position, sampler.Sampler.draw) and keeps the drafts while
they are that token. So the committed tokens are exactly those of plain decoding, seeded
sampling included; a draft is accepted with the probability the target gives it (for a draft
model drawing with the same key, where their distributions agree).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runner.sampling.sampler import Sampler


@dataclass(frozen=True)
class Verdict:
    committed_ids: list[int]  # accepted drafts, then the target's own token
    n_accepted: int  # how many leading committed_ids are accepted drafts


def verify(sampler: Sampler, rows: np.ndarray, draft_ids: list[int], first_pos: int) -> Verdict:
    """Decide which drafts the target keeps, and its own next token; `first_pos`: the sequence
    position of the token row 0 decides. Updates the sampler's history."""
    for i, draft in enumerate(draft_ids):
        target = sampler.sample(rows[i], first_pos + i)
        if target != draft:
            return Verdict(draft_ids[:i] + [target], i)
        sampler.accept(draft)
    last = rows[len(draft_ids)] if draft_ids else rows  # (no drafts: the block is that one row)
    return Verdict(draft_ids + [sampler.sample(last, first_pos + len(draft_ids))], len(draft_ids))
