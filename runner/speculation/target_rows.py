"""What the target's decodes leave for an MTP or EAGLE3 drafter: per slot and position, the row
the drafter reads for that committed token (its hidden row; EAGLE3's three layer inputs), with the
tokens they belong to. Filled after every step from the runtime's tap (ModelRunner.tapped), prompt
chunks included; a rejected draft's rows are never kept."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from runner.scheduler.batch import BatchPlan

UNKNOWN = -1  # a position whose row was not kept
ROW_BYTES = 2  # rows are kept as F16: half the memory, and a draft's inputs need no more
FIRST_ROWS = 256  # a slot's rows start this long and double as its context grows


class Tapped(Protocol):
    tapped: np.ndarray
    tapped_starts: list[int]


class TargetRows:
    def __init__(self, width: int, n_ctx_per_slot: int) -> None:
        self.width = width
        self.n_ctx_per_slot = n_ctx_per_slot
        self._rows: dict[int, np.ndarray] = {}  # slot -> (positions, width)
        self._ids: dict[int, list[int]] = {}  # slot -> the committed token at each position with a row

    def record(self, plan: BatchPlan, tapped: Tapped) -> None:
        """Keep the step's rows of committed tokens: a prompt chunk's all, a generating row's token
        and its accepted drafts."""
        for i, row in enumerate(plan.rows):
            n_kept = len(row.token_ids) if row.is_prompt else 1 + row.n_accepted
            start = tapped.tapped_starts[i]
            self.put(row.seq_id, row.first_pos, row.token_ids[:n_kept], tapped.tapped[start : start + n_kept])

    def put(self, slot: int, first_pos: int, token_ids: list[int], rows: np.ndarray) -> None:
        end = first_pos + len(token_ids)
        held = self._rows.get(slot)
        if held is None or len(held) < end:
            grown = np.zeros((min(self.n_ctx_per_slot, max(FIRST_ROWS, end, 2 * (0 if held is None else len(held)))),
                              self.width), dtype=np.float16)
            if held is not None:
                grown[: len(held)] = held
            held = self._rows[slot] = grown
        held[first_pos:end] = rows
        ids = self._ids.setdefault(slot, [])
        del ids[first_pos:]
        ids.extend([UNKNOWN] * (first_pos - len(ids)))  # (positions decoded while no rows were kept)
        ids.extend(token_ids)

    def covers(self, slot: int, context_ids: list[int], lo: int, hi: int) -> bool:
        """Are there rows of this context's tokens for positions [lo, hi)?"""
        ids = self._ids.get(slot, [])
        return len(ids) >= hi and ids[lo:hi] == context_ids[lo:hi]

    def get(self, slot: int, p0: int, p1: int) -> np.ndarray:
        """Rows for positions [p0, p1); a position before 0 gets zeros (a prompt's first token has no row before it)."""
        out = np.zeros((p1 - p0, self.width), dtype=np.float32)
        lo = max(p0, 0)
        if p1 > lo:
            out[lo - p0 :] = self._rows[slot][lo:p1]
        return out

    def forget(self, slot: int) -> None:
        self._rows.pop(slot, None)
        self._ids.pop(slot, None)

    def copy(self, src: int, dst: int) -> None:
        """A slot's KV copied into another: its rows go along."""
        if src in self._rows:
            self._rows[dst] = self._rows[src].copy()
            self._ids[dst] = list(self._ids[src])

    @property
    def n_bytes(self) -> int:
        return sum(r.nbytes for r in self._rows.values())
