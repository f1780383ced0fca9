"""Load-time measurement of decode costs by batch shape (for `--spec auto`); calibration_cache.py keeps them."""

from __future__ import annotations

import time

from runner.runtime.llama import Batch, Context

SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64)  # tokens of one sequence (verification and prefill rows)
SEQ_COUNTS = (2, 4, 8, 16)  # micro-batches of several sequences, each with ...
TOKENS_EACH = (1, 2, 3, 4, 5, 6, 8)  # ... this many tokens
N_REPEATS = 4

CostTables = dict[str, dict[str, list]]  # str(sequence count) -> {"sizes": tokens each, "seconds": per decode}


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


def measure(context: Context) -> CostTables:
    """Time decodes (every token outputting logits, like verification rows) of one sequence with
    1..64 tokens, and of 2..16 sequences with 1..8 tokens each, in the context's empty sequences.

    Shapes are timed round-robin (drift spreads over all of them), a round of warm-up first;
    each shape's fastest time is kept (interference only ever adds time, and a burst of it during
    one round skews a median), then
    made non-decreasing in tokens (more work never costs less)."""
    shape = context.shape
    batch = Batch(shape.n_batch, context.n_embd_inp)  # (an MTP context's rows carry a hidden row too)
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
    tables = {}
    for n_seqs, sizes in grid.items():
        seconds, floor = [], 0.0
        for n in sizes:
            floor = max(floor, min(runs[(n_seqs, n)]))
            seconds.append(floor)
        tables[str(n_seqs)] = {"sizes": list(sizes), "seconds": seconds}
    return tables
