"""How llama.cpp runs one batch: the micro-batches (graph runs) it splits it into, and padding.

With one KV stream per slot (kv_unified=false) llama.cpp splits a batch into micro-batches
(`split_equal` in sequential mode): starting at the first row with tokens left, it takes the
rows after it whose sequence ids count up by one (in batch order; a row with nothing left ends
the run), then the same number of tokens from each of them: the fewest any has left, capped by
n_ubatch. Rows of unequal length, or with a gap between their slot ids, cost one graph run each
way they differ: slots 0 and 2 decoding one token each run twice, slots 0 and 1 once.

Some CPU kernels are not batch-invariant: llama.cpp's tinyBLAS matrix multiply takes over from
the plain dot-product loop only for two or more columns, and the two sum in different orders
(F16 weights: logits differ by ~0.01). So a micro-batch of one token, or one whose output
matmul sees a single logits row, gives different numbers than the same token in a wider batch,
and greedy output would depend on what else shared the step. `pad` widens such micro-batches:
a junk token after a lone row (its KV position is removed after the decode), an extra logits
row where a micro-batch has exactly one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Row:
    """One sequence's run of tokens in batch order; the last n_logits of them output logits."""

    seq_id: int
    n_tokens: int
    n_logits: int = 0


@dataclass(frozen=True)
class Piece:
    """Tokens [start, start + n) of rows[row], part of one micro-batch."""

    row: int
    start: int
    n: int


def split(rows: Sequence[Row], n_ubatch: int) -> list[list[Piece]]:
    """The micro-batches llama.cpp makes of these rows (one KV stream per sequence)."""
    done = [0] * len(rows)
    micro_batches: list[list[Piece]] = []
    while True:
        first = next((i for i, r in enumerate(rows) if done[i] < r.n_tokens), None)
        if first is None:
            return micro_batches
        run, last_seq = [first], rows[first].seq_id
        for i in range(first + 1, len(rows)):
            if done[i] < rows[i].n_tokens and rows[i].seq_id == last_seq + 1:
                run.append(i)
                last_seq = rows[i].seq_id
        take = min(min(rows[i].n_tokens - done[i] for i in run), max(1, n_ubatch // len(run)))
        micro_batches.append([Piece(i, done[i], take) for i in run])
        for i in run:
            done[i] += take


def with_junk(rows: Sequence[Row], junk: Sequence[int]) -> list[Row]:
    """The rows as llama.cpp sees them once each has its junk tokens appended."""
    return [Row(r.seq_id, r.n_tokens + j, r.n_logits) for r, j in zip(rows, junk)]


@dataclass
class Padding:
    junk: list[int]  # junk tokens appended to each row
    extra_logits: list[list[int]] = field(default_factory=list)  # per row: token offsets also given logits

    @property
    def is_empty(self) -> bool:
        return not any(self.junk) and not any(self.extra_logits)


def pad(rows: Sequence[Row], n_ubatch: int, room: Sequence[int] | None = None,
        max_junk: int | None = None) -> Padding:
    """Junk tokens and extra logits rows so that no micro-batch has one token or one logits row.

    room[i]: how many junk tokens row i's sequence can still hold (its context's end);
    max_junk: how many the batch can still hold."""
    junk = [0] * len(rows)
    while True:  # every lone row of a split gets its junk token at once, then split again
        micro_batches = split(with_junk(rows, junk), n_ubatch)
        lone = [mb[0].row for mb in micro_batches if sum(p.n for p in mb) == 1
                and (room is None or junk[mb[0].row] < room[mb[0].row])]
        if max_junk is not None:
            lone = lone[: max(0, max_junk - sum(junk))]
        if not lone:
            break
        for row in lone:
            junk[row] += 1
    extra: list[list[int]] = [[] for _ in rows]
    for mb in micro_batches:
        outputs, others = 0, []
        for p in mb:
            first_logit = rows[p.row].n_tokens - rows[p.row].n_logits
            for t in range(p.start, p.start + p.n):
                if first_logit <= t < rows[p.row].n_tokens:
                    outputs += 1
                else:
                    others.append((p.row, t))
        if outputs == 1 and others:
            row, t = others[0]
            extra[row].append(t)
    return Padding(junk, extra)
