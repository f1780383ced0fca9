"""Measured cost of one llama_decode by batch size, for the target and a draft model.

`--spec auto` compares expected tokens against these costs. Measured once per model file,
thread count and machine (a short calibration at start), then cached as JSON.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from runner.llama import Batch, Context

SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64)
N_REPEATS = 3
CALIBRATION_FILE = "calibration.json"


@dataclass(frozen=True)
class CostTable:
    """Seconds per llama_decode of n tokens, linearly interpolated between measured sizes."""

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]

    def __call__(self, n_tokens: int) -> float:
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


def equal_split_s(table: CostTable, row_lens: list[int]) -> float:
    """Cost of one llama_decode whose rows (one per sequence) have these lengths.

    NOTE: with one KV stream per sequence, llama.cpp splits a batch into micro-batches that take
    the same number of tokens from every sequence still in it, so rows of unequal length cost
    one graph run per distinct length: (5, 1, 1, 1) runs as 4x1 tokens, then 1x4."""
    left = sorted(n for n in row_lens if n > 0)
    total, done = 0.0, 0
    while left:
        take = left[0] - done
        total += table(take * len(left))
        done = left[0]
        left = [n for n in left if n > done]
    return total


@dataclass(frozen=True)
class StepCosts:
    target: CostTable
    draft: CostTable | None = None  # None: drafting is free (n-gram)

    def step_s(self, row_lens: list[int], ks: list[int], catch_up: list[int] | None = None) -> float:
        """Time of one step: the target batch (its rows' lengths, drafts included) plus one
        draft decode per draft depth. catch_up[i]: committed tokens slot i's draft KV lacks."""
        total = equal_split_s(self.target, row_lens)
        if self.draft is not None:
            for depth in range(1, max(ks, default=0) + 1):
                drafting = [i for i, k in enumerate(ks) if k >= depth]
                n_tokens = sum(catch_up[i] for i in drafting) if catch_up and depth == 1 else len(drafting)
                total += self.draft(n_tokens)
        return total


def measure(context: Context, seq_id: int, sizes: tuple[int, ...] = SIZES) -> CostTable:
    """Time decodes of n tokens (all outputting logits, like verification rows) in a scratch sequence."""
    batch = Batch(max(sizes))
    seconds = []
    for n in sizes:
        runs = []
        for _ in range(N_REPEATS + 1):  # the first run of each size warms up
            batch.clear()
            batch.add(seq_id, [1] * n, 0, n)
            started = time.perf_counter()
            context.decode(batch)
            runs.append(time.perf_counter() - started)
            context.kv_remove(seq_id, 0, -1)
        seconds.append(statistics.median(runs[1:]))
    return CostTable(tuple(sizes), tuple(seconds))


def cached_table(cache_dir: Path, key: str, make: Callable[[], CostTable]) -> CostTable:
    """The table for `key` from the calibration file, measured and stored when missing."""
    path = cache_dir / CALIBRATION_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    entry = data.get(key)
    if entry:
        return CostTable(tuple(entry["sizes"]), tuple(entry["seconds"]))
    table = make()
    data[key] = {"sizes": list(table.sizes), "seconds": list(table.seconds)}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)
    return table


def calibration_key(model_path: Path, n_threads: int, n_gpu_layers: int) -> str:
    stat = model_path.stat()
    return f"{model_path.name}:{stat.st_size}:{int(stat.st_mtime)}:t{n_threads}:g{n_gpu_layers}:{platform.machine()}:{platform.node()}"
