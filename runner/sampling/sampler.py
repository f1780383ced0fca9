"""Token sampling in numpy: penalties, temperature, top_k, top_p, min_p, seeded draws.

numpy rather than llama.cpp's sampler chain because speculative decoding needs the
target's whole probability distribution at each position (for the rejection rule), and
a numpy row over the logits view costs tens of microseconds per token at this vocab size.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
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
        self.params = params
        self.constraint = constraint  # masks every row it samples; advances with every accepted token
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little")
        self._rng = np.random.default_rng(seed)
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
        x = self.adjusted_logits(logits)
        n_vocab = x.shape[0]
        if 0 < p.top_k < n_vocab:
            ids = np.sort(top_k_ids(x, p.top_k))  # (sorted: equal logits keep the lower id first)
        else:
            ids = np.arange(n_vocab)
        scaled = x[ids].astype(np.float64) / p.temperature
        order = np.argsort(-scaled, kind="stable")
        ids, scaled = ids[order], scaled[order]
        probs = np.exp(scaled - scaled[0])
        if self.masks:  # masked tokens have probability 0: never candidates
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

    def greedy_token(self, logits: np.ndarray) -> int:
        """The most likely token of one row (or of a block holding one row: then no row is cut out,
        which costs ~10 us with numpy's code cold after a decode)."""
        if not self.adjusts:
            return int(logits.argmax())
        return int(np.argmax(self.adjusted_logits(logits.reshape(-1))))

    def sample(self, logits: np.ndarray) -> int:
        dist = self.distribution(logits)
        if len(dist.token_ids) == 1:
            return int(dist.token_ids[0])
        return self.draw(dist)

    def uniform(self) -> float:
        return float(self._rng.random())

    def draw(self, dist: Distribution) -> int:
        index = int(np.searchsorted(np.cumsum(dist.probs), self._rng.random() * dist.probs.sum(), side="right"))
        return int(dist.token_ids[min(index, len(dist.token_ids) - 1)])


TOP_K_CHUNKS = 256  # top_k_ids bounds the k-th largest logit by the maxima of this many slices of the row


def top_k_ids(x: np.ndarray, k: int) -> np.ndarray:
    """The ids of the k largest values of x (0 < k < len(x)), in no particular order.

    np.argpartition over a 49k-token row took ~0.5 ms, the most of a sampled token's time outside
    llama_decode. The k-th largest of the maxima of disjoint slices is a value that k entries
    reach, so the k largest entries all lie at or above it: usually a few hundred entries, which
    are partitioned instead of the whole row."""
    n = len(x)
    n_chunks = min(TOP_K_CHUNKS, n)
    if k < n_chunks:
        width = n // n_chunks
        maxima = x[: n_chunks * width].reshape(n_chunks, width).max(axis=1)
        candidates = np.flatnonzero(x >= np.partition(maxima, n_chunks - k)[n_chunks - k])
        if len(candidates) >= k:  # (always, unless the row holds NaN)
            return candidates[np.argpartition(x[candidates], len(candidates) - k)[len(candidates) - k :]]
    return np.argpartition(x, n - k)[n - k :]


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
