"""Measured cost of one llama_decode by batch size, for the target and a draft model.

`--spec auto` compares expected tokens against these costs. Measured once per model file,
thread count and machine (a short calibration at start), then cached as JSON.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.llama import Batch, Context
from runner.micro_batches import Row, pad, split, with_junk

SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64)  # tokens of one sequence (verification and prefill rows)
SEQ_COUNTS = (2, 4, 8, 16)  # micro-batches of several sequences, each with ...
TOKENS_EACH = (1, 2, 3, 4, 5, 6, 8)  # ... this many tokens
N_REPEATS = 4
MEMO_MAX = 50_000
CALIBRATION_FILE = "calibration.json"
CALIBRATION_VERSION = "v4"  # bumped when measure() changes: older entries are measured again, and dropped


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
    n_ubatch: int = 512
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


def _time_decode(context: Context, batch: Batch, n_seqs: int, n_each: int) -> float:
    batch.clear()
    for seq in range(n_seqs):
        batch.add(seq, [1] * n_each, 0, n_each)
    started = time.perf_counter()
    context.decode(batch)
    elapsed = time.perf_counter() - started
    for seq in range(n_seqs):
        context.kv_remove(seq, 0, -1)
    return elapsed


def measure(context: Context) -> ShapeCosts:
    """Time decodes (every token outputting logits, like verification rows) of one sequence with
    1..64 tokens, and of 2..16 sequences with 1..8 tokens each, in the context's empty sequences.

    Shapes are timed round-robin (drift spreads over all of them), a round of warm-up first;
    each shape's fastest time is kept (interference only ever adds time, and a burst of it during
    one round skewed medians: 1 token priced at 3x its real cost next to 5 tokens at 2x), then
    made non-decreasing in tokens (more work never costs less)."""
    shape = context.shape
    batch = Batch(shape.n_batch)
    grid = {}  # sequence count -> tokens each, the shapes this context can run in one micro-batch
    for n_seqs, sizes in [(1, SIZES)] + [(n, TOKENS_EACH) for n in SEQ_COUNTS if n <= shape.n_seq]:
        fitting = [n for n in sizes if n <= shape.n_ctx_per_seq and n_seqs * n <= shape.n_ubatch]
        if len(fitting) >= 2:
            grid[n_seqs] = fitting
    runs: dict[tuple[int, int], list[float]] = {(s, n): [] for s, sizes in grid.items() for n in sizes}
    for round_ in range(N_REPEATS + 1):
        for (n_seqs, n_each), times in runs.items():
            elapsed = _time_decode(context, batch, n_seqs, n_each)
            if round_:
                times.append(elapsed)
    by_seqs = {}
    for n_seqs, sizes in grid.items():
        seconds, floor = [], 0.0
        for n in sizes:
            floor = max(floor, min(runs[(n_seqs, n)]))
            seconds.append(floor)
        by_seqs[n_seqs] = CostTable(tuple(sizes), tuple(seconds))
    return ShapeCosts(by_seqs)


def cached_json(cache_dir: Path, key: str, make: Callable[[], Any]) -> Any:
    """The calibration file's entry for `key`, measured by make() and stored when missing."""
    path = cache_dir / CALIBRATION_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    if key in data:
        return data[key]
    value = make()
    data = {k: v for k, v in data.items() if k.startswith(CALIBRATION_VERSION + ":")}
    data[key] = value
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)
    return value


def cached_costs(cache_dir: Path, key: str, make: Callable[[], ShapeCosts]) -> ShapeCosts:
    """The costs for `key` from the calibration file, measured and stored when missing."""
    return ShapeCosts.from_json(cached_json(cache_dir, key, lambda: make().to_json()))


def _file_key(path: Path) -> str:
    stat = path.stat()
    return f"{path.name}:{stat.st_size}:{int(stat.st_mtime)}"


def calibration_key(model_path: Path, n_threads: int, n_gpu_layers: int, n_seq: int, n_ubatch: int) -> str:
    return (f"{CALIBRATION_VERSION}:{_file_key(model_path)}:t{n_threads}:g{n_gpu_layers}"
            f":s{min(n_seq, max(SEQ_COUNTS))}:u{n_ubatch}:{platform.machine()}:{platform.node()}")


def agreement_key(target_path: Path, draft_path: Path) -> str:
    """A pair's draft agreement depends on the two files only (not threads or machine)."""
    return f"{CALIBRATION_VERSION}:agreement:{_file_key(target_path)}:{_file_key(draft_path)}"
