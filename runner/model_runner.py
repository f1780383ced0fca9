"""The real runtime under the scheduler: a llama.cpp context whose sequences are the slots."""

from __future__ import annotations

import numpy as np

from runner.llama import Batch, Context, ContextShape, Model
from runner.scheduler import BatchRow


class ModelRunner:
    def __init__(self, model: Model, shape: ContextShape) -> None:
        self.model = model
        self.context = Context(model, shape)
        self._batch = Batch(shape.n_batch)

    def decode(self, rows: list[BatchRow]) -> np.ndarray:
        """Put every row into one batch, run one llama_decode, return the logits rows (a view)."""
        batch = self._batch
        batch.clear()
        for row in rows:
            row.first_logit = batch.add(row.slot.id, row.token_ids, row.first_pos, row.n_logits)
        return self.context.decode(batch)

    def kv_remove(self, seq_id: int, p0: int = 0, p1: int = -1) -> bool:
        return self.context.kv_remove(seq_id, p0, p1)

    def close(self) -> None:
        self.context.close()  # the model is owned (and freed) by whoever loaded it
