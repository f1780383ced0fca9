"""The real runtime under the scheduler: a llama.cpp context whose sequences are the slots."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from runner.llama import Batch, Context, ContextShape, Model
from runner.scheduler import BatchRow

TRACE_ENV = "RUNNER_BATCH_TRACE"  # a path: record every batch's shape and KV edit (bench/parallel.py replays it)


class ModelRunner:
    def __init__(self, model: Model, shape: ContextShape) -> None:
        self.model = model
        self.context = Context(model, shape)
        self._batch = Batch(shape.n_batch)
        trace_path = os.environ.get(TRACE_ENV)
        self._trace_path = Path(trace_path) if trace_path else None
        self._trace: list[list] = []

    def decode(self, rows: list[BatchRow]) -> np.ndarray:
        """Put every row into one batch, run one llama_decode, return the logits rows (a view)."""
        batch = self._batch
        batch.clear()
        for row in rows:
            row.first_logit = batch.add(row.slot.id, row.token_ids, row.first_pos, row.n_logits)
        if self._trace_path:
            self._trace.append(["decode", [[r.slot.id, r.token_ids, r.first_pos, r.n_logits] for r in rows]])
        return self.context.decode(batch)

    def kv_remove(self, seq_id: int, p0: int = 0, p1: int = -1) -> bool:
        if self._trace_path:
            self._trace.append(["kv_remove", [seq_id, p0, p1]])
        return self.context.kv_remove(seq_id, p0, p1)

    def kv_copy_all(self, src_seq: int, dst_seq: int) -> None:
        """Make dst's KV a copy of src's (one stream per slot: llama.cpp copies whole streams)."""
        if self._trace_path:
            self._trace.append(["kv_copy_all", [src_seq, dst_seq]])
        self.context.kv_copy(src_seq, dst_seq, -1, -1)

    def close(self) -> None:
        if self._trace_path:
            self._trace_path.write_text("\n".join(json.dumps(op) for op in self._trace))
        self.context.close()  # the model is owned (and freed) by whoever loaded it
