"""What a step costs: seconds per llama_decode by batch shape, for the target and a draft model.

`--spec auto` compares expected tokens against these costs. Pure: the tables come from
runtime/calibration.py (measured once per model file, thread count and machine, cached as JSON).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from runner.config.options import N_UBATCH_MAX
from runner.runtime.micro_batches import Row, pad, split, with_junk

MEMO_MAX = 50_000


@dataclass(frozen=True)
class CostTable:
    """Seconds per llama_decode of n tokens, linearly interpolated between measured sizes."""

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]

    def __call__(self, n_tokens: float) -> float:
        if n_tokens <= 0:
            return 0.0
        xs, ys = self.sizes, self.seconds
        if n_tokens <= xs[0]:
            return ys[0]
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            if n_tokens <= x1:
                return y0 + (y1 - y0) * (n_tokens - x0) / (x1 - x0)
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return ys[-1] + slope * (n_tokens - xs[-1])


@dataclass(frozen=True)
class ShapeCosts:
    """Seconds per graph run of n_seqs sequences with the same number of tokens each.

    Several sequences cost more than one with as many tokens (attention runs per KV stream),
    so each sequence count measured has its own table; counts in between are interpolated and
    counts above the largest measured one are priced by their total tokens."""

    by_seqs: dict[int, CostTable]

    def micro_batch_s(self, n_seqs: int, n_each: int) -> float:
        if n_seqs in self.by_seqs:
            return self.by_seqs[n_seqs](n_each)
        lower = max(c for c in self.by_seqs if c < n_seqs)
        upper = min((c for c in self.by_seqs if c > n_seqs), default=None)
        if upper is None:
            return self.by_seqs[lower](n_each * n_seqs / lower)
        w = (n_seqs - lower) / (upper - lower)
        return (1 - w) * self.by_seqs[lower](n_each) + w * self.by_seqs[upper](n_each)

    def batch_s(self, rows: Sequence[Row], n_ubatch: int, pads: bool = False) -> float:
        """One llama_decode of these rows: its micro-batches (micro_batches.split), padded if asked."""
        rows = sorted(rows, key=lambda r: r.seq_id)
        if pads:
            rows = with_junk(rows, pad(rows, n_ubatch).junk)
        return sum(self.micro_batch_s(len(mb), mb[0].n) for mb in split(rows, n_ubatch))

    def to_json(self) -> dict:
        return {str(n): {"sizes": list(t.sizes), "seconds": list(t.seconds)} for n, t in self.by_seqs.items()}

    @classmethod
    def from_json(cls, data: dict) -> ShapeCosts:
        return cls({int(n): CostTable(tuple(t["sizes"]), tuple(t["seconds"])) for n, t in data.items()})


@dataclass(frozen=True)
class StepCosts:
    target: ShapeCosts
    draft: ShapeCosts | None = None  # None: drafting is free (n-gram)
    n_ubatch: int = N_UBATCH_MAX
    pads: bool = False  # the target's batches are padded to stay batch-invariant
    _memo: dict = field(default_factory=dict, compare=False, repr=False)  # the same shapes recur step after step

    def step_s(self, rows: Sequence[Row], ks: dict[int, int], catch_up: dict[int, int] | None = None) -> float:
        """Time of one step: the target batch (rows with their drafts) plus, for a draft model,
        one draft decode per draft depth. catch_up[seq]: committed tokens its draft KV lacks."""
        key = (tuple(rows), tuple(ks.items()), tuple(catch_up.items()) if catch_up else None)
        seconds = self._memo.get(key)
        if seconds is None:
            if len(self._memo) > MEMO_MAX:
                self._memo.clear()
            seconds = self._memo[key] = self._step_s(rows, ks, catch_up)
        return seconds

    def _step_s(self, rows: Sequence[Row], ks: dict[int, int], catch_up: dict[int, int] | None) -> float:
        total = self.target.batch_s(rows, self.n_ubatch, self.pads)
        if self.draft is not None:
            for depth in range(1, max(ks.values(), default=0) + 1):
                drafting = [seq for seq, k in ks.items() if k >= depth]
                lens = {seq: (catch_up or {}).get(seq, 1) if depth == 1 else 1 for seq in drafting}
                total += self.draft.batch_s([Row(seq, max(1, n)) for seq, n in lens.items()], self.n_ubatch)
        return total
