"""Token sampling: penalties, temperature, top_k, top_p, min_p, seeded draws.

Here rather than llama.cpp's sampler chain because speculative decoding needs the target's
distribution at each position, and the same draw there with drafts or without. numpy finds the
few candidates in the vocabulary row; the truncations and the draw run on those in plain Python.

A draw is keyed by the request's seed and the token's position in the sequence, not taken from
a stream: the token at a position is the same however many draws came before it (drafts a step
verified or not, a prompt cached or computed), so a seeded reply is the same with speculation on
or off, and a draft model drawing with the same key agrees with the target where their
distributions do.
"""

from __future__ import annotations

import dataclasses
import math
import os
from bisect import bisect_left, bisect_right
from collections import Counter
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING

import numpy as np

from runner.sampling.params import SamplingParams

if TYPE_CHECKING:
    from runner.sampling.constraints import AnyConstraint


@dataclass(frozen=True)
class Distribution:
    """A sparse next-token distribution: candidate ids with probabilities summing to 1."""

    token_ids: np.ndarray
    probs: np.ndarray


class Sampler:
    """Per-request sampling state: the RNG and the token history penalties look at."""

    def __init__(self, params: SamplingParams, prompt_ids: list[int] | None = None,
                 constraint: AnyConstraint | None = None) -> None:
        if params.seed is None:  # (a random one, kept: a drafter draws with it too)
            params = dataclasses.replace(params, seed=int.from_bytes(os.urandom(8), "little"))
        self.params = params
        self.constraint = constraint  # masks every row it samples; advances with every accepted token
        self._key = _mix(params.seed % 2**64)  # (a negative seed wraps, as the OpenAI dialect's does)
        self._recent: list[int] = list(prompt_ids or [])[-params.repeat_last_n :] if params.repeat_last_n else []
        self._generated_counts: Counter[int] = Counter()
        ids, bias = zip(*params.logit_bias) if params.logit_bias else ((), ())
        self._bias = (np.array(ids, dtype=np.int64), np.array(bias, dtype=np.float32))

    def accept(self, token_id: int) -> None:
        """Record a token that became part of the output (penalties and the grammar look at it)."""
        if self.constraint is not None:
            self.constraint.advance(token_id)
        if not self.params.has_penalties:  # nothing reads the history: skip the per-token bookkeeping
            return
        if self.params.repeat_last_n:
            self._recent.append(token_id)
            if len(self._recent) > self.params.repeat_last_n:
                del self._recent[0]
        self._generated_counts[token_id] += 1

    @property
    def masks(self) -> bool:
        """A grammar masks the rows (a lazy one only once it has begun)."""
        return self.constraint is not None and self.constraint.is_active

    @property
    def adjusts(self) -> bool:
        """Whether a bias, a penalty or the grammar changes the logits."""
        return self.params.has_penalties or bool(self.params.logit_bias) or self.masks

    def adjusted_logits(self, logits: np.ndarray) -> np.ndarray:
        """Logits after the bias, penalties and grammar (a copy only when one is set)."""
        p = self.params
        if not self.adjusts:
            return logits
        out = np.array(logits, dtype=np.float32, copy=True)
        if self.constraint is not None and self.masks:
            self.constraint.mask_into(out)
        if p.logit_bias:
            ids, bias = self._bias
            out[ids] += bias
        if p.repeat_penalty != 1.0 and self._recent:
            ids = np.fromiter(set(self._recent), dtype=np.int64)
            vals = out[ids]
            out[ids] = np.where(vals > 0, vals / p.repeat_penalty, vals * p.repeat_penalty)
        if (p.presence_penalty or p.frequency_penalty) and self._generated_counts:
            ids = np.fromiter(self._generated_counts.keys(), dtype=np.int64)
            counts = np.fromiter(self._generated_counts.values(), dtype=np.float32)
            out[ids] -= p.presence_penalty + p.frequency_penalty * counts
        return out

    def distribution(self, logits: np.ndarray) -> Distribution:
        """The distribution the next token is drawn from (greedy: a point mass)."""
        p = self.params
        if p.is_greedy:
            return Distribution(np.array([self.greedy_token(logits)]), np.array([1.0]))
        x = self.adjusted_logits(logits.reshape(-1))  # (a block holding one row: that row)
        k = p.top_k if p.top_k > 0 else len(x)
        # min_p drops every token whose probability is below min_p times the largest: its logit lies more
        # than T * ln(1 / min_p) below the largest (a little more spares rounding the exact test below)
        span = p.temperature * -math.log(p.min_p) + 1e-3 if p.min_p > 0.0 else math.inf
        ids = top_k_ids(x, k, span)  # (ascending: equal logits keep the lower id first)
        if len(ids) == 1:  # (often, with min_p: nothing else within its reach)
            return Distribution(ids, np.array([1.0]))
        if len(ids) <= FEW_CANDIDATES:
            return _truncated_few(ids.tolist(), x[ids].tolist(), p, self.masks)
        return _truncated_many(ids, x, p, self.masks)

    def greedy_token(self, logits: np.ndarray) -> int:
        """The most likely token of one row (or of a block holding one row: then no row is cut out,
        which costs ~10 us with numpy's code cold after a decode)."""
        if not self.adjusts:
            return int(logits.argmax())
        return int(np.argmax(self.adjusted_logits(logits.reshape(-1))))

    def sample(self, logits: np.ndarray, pos: int) -> int:
        """The token for sequence position `pos` from its logits row (greedy: the argmax)."""
        if self.params.is_greedy:
            return self.greedy_token(logits)
        return self.draw(self.distribution(logits), pos)

    def draw(self, dist: Distribution, pos: int) -> int:
        """The token of the distribution for sequence position `pos`: the position's uniform number
        against the running sums of the candidates in token id order (the order two models'
        distributions share, so close ones give the same token). In plain Python for a few
        candidates, in numpy for many: the same sums, so the same token."""
        if len(dist.token_ids) == 1:
            return int(dist.token_ids[0])
        u = _uniform(self._key, pos)
        if len(dist.probs) <= FEW_CANDIDATES:
            pairs = sorted(zip(dist.token_ids.tolist(), dist.probs.tolist()))
            cum: list[float] | np.ndarray = list(accumulate(p for _, p in pairs))
            return pairs[min(bisect_right(cum, u * cum[-1]), len(pairs) - 1)][0]
        order = np.argsort(dist.token_ids, kind="stable")
        cum = np.cumsum(dist.probs[order])
        index = int(np.searchsorted(cum, u * cum[-1], side="right"))
        return int(dist.token_ids[order[min(index, len(cum) - 1)]])


_MASK = (1 << 64) - 1


def _mix(z: int) -> int:
    """splitmix64's finaliser: 64 well-mixed bits of z."""
    z = (z + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _uniform(key: int, pos: int) -> float:
    """A uniform number in [0, 1) for (a seed's key, a position): counter-based, so any position's
    comes without drawing those before it."""
    return (_mix(key ^ pos) >> 11) * 2.0**-53


# Up to this many candidates (the top_k default is 40) the truncations run in plain Python: a sampled
# token's ~30 numpy calls on a few dozen values cost ~120 us with numpy's code cold after a decode.
FEW_CANDIDATES = 512


def _truncated_few(ids: list[int], logits: list[float], p: SamplingParams, masked: bool) -> Distribution:
    """Temperature, softmax, min_p and top_p over a few candidates (ids ascending): the steps of
    _truncated_many, in plain Python."""
    order = sorted(range(len(ids)), key=logits.__getitem__, reverse=True)  # (stable: ties keep the lower id)
    scaled = [logits[i] / p.temperature for i in order]
    ids = [ids[i] for i in order]
    weights = [math.exp(v - scaled[0]) for v in scaled]
    if masked:  # masked tokens have probability 0: never candidates
        ids = [t for t, w in zip(ids, weights) if w > 0.0]
        weights = [w for w in weights if w > 0.0]
    total = sum(weights)
    probs = [w / total for w in weights]
    n_keep = len(probs)
    if p.min_p > 0.0:
        n_keep = sum(1 for q in probs if q >= p.min_p * probs[0])
    if p.top_p < 1.0:
        cum = list(accumulate(probs[:n_keep]))
        n_keep = min(n_keep, bisect_left(cum, p.top_p * cum[-1]) + 1)
    total = sum(probs[:n_keep])
    return Distribution(np.array(ids[:n_keep]), np.array([q / total for q in probs[:n_keep]]))


def _truncated_many(ids: np.ndarray, x: np.ndarray, p: SamplingParams, masked: bool) -> Distribution:
    """Temperature, softmax, min_p and top_p over the candidates `ids` (ascending) of the row x."""
    scaled = x[ids].astype(np.float64) / p.temperature
    order = np.argsort(-scaled, kind="stable")
    ids, scaled = ids[order], scaled[order]
    probs = np.exp(scaled - scaled[0])
    if masked:
        ids, probs = ids[probs > 0], probs[probs > 0]
    probs /= probs.sum()
    if p.min_p > 0.0:
        n_keep = int(np.count_nonzero(probs >= p.min_p * probs[0]))
        ids, probs = ids[:n_keep], probs[:n_keep]
    if p.top_p < 1.0:
        cum = np.cumsum(probs)
        n_keep = int(np.searchsorted(cum, p.top_p * cum[-1])) + 1
        ids, probs = ids[:n_keep], probs[:n_keep]
    return Distribution(ids, probs / probs.sum())


FIRST_DISTANCE = 8.0  # top_k_ids first looks this far below the largest logit, then 4x as far, ...
FAR = 1000.0  # ... and past this (no real row of logits spans it: a grammar's -inf mask) at everything


def top_k_ids(x: np.ndarray, k: int, span: float = math.inf) -> np.ndarray:
    """The ids of the k largest values of x, ascending, leaving out those more than `span` below
    the largest (min_p's bound): exactly k of them when span is infinite.

    np.argpartition over a 49k-token row took ~0.5 ms. After a decode every distinct numpy
    operation runs cold (~20-60 us for its first call), so this uses few: the largest value, the
    entries within a distance of it that grows until k lie there (the k largest all do), and a
    partition of just those, usually a few dozen."""
    n = len(x)
    if k >= n and span == math.inf:
        return np.arange(n)
    top = float(x[int(x.argmax())])
    distance = min(FIRST_DISTANCE, span)
    while True:
        candidates = np.flatnonzero(x >= top - distance)
        if len(candidates) >= k or distance >= span:
            break
        distance = min(distance * 4, span) if distance < FAR else math.inf
    if len(candidates) <= k:
        return candidates
    return np.sort(candidates[np.argpartition(x[candidates], len(candidates) - k)[len(candidates) - k :]])


def top_logprobs(logits: np.ndarray, token_id: int, n_top: int) -> tuple[float, list[tuple[int, float]]]:
    """Log-probability of `token_id` under the raw logits, and the n_top most likely tokens."""
    x = logits.astype(np.float64)
    log_z = float(np.log(np.exp(x - x.max()).sum()) + x.max())
    chosen = float(x[token_id] - log_z)
    if n_top <= 0:
        return chosen, []
    top = np.argpartition(x, -n_top)[-n_top:]
    top = top[np.argsort(-x[top], kind="stable")]
    return chosen, [(int(t), float(x[t] - log_z)) for t in top]
