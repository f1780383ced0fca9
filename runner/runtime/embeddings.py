"""Embeddings: inputs (token ids) packed into as few decodes of the embedding context as fit, each
vector L2-normalized (as OpenAI's are: cosine similarity is then a dot product)."""

from __future__ import annotations

import numpy as np

from runner.core.errors import InputError
from runner.runtime.llama import EmbeddingContext, Model

MAX_INPUTS_PER_DECODE = 32


class InputTooLongError(InputError):
    """An input has more tokens than the embedding context holds."""


class Embedder:
    def __init__(self, model: Model, n_ctx: int, n_threads: int) -> None:
        self.context = EmbeddingContext(model, n_ctx, MAX_INPUTS_PER_DECODE, n_threads)
        self.n_ctx = n_ctx

    @property
    def dimensions(self) -> int:
        return self.context.n_embd

    @property
    def pooling(self) -> str:
        return self.context.pooling

    def check(self, inputs: list[list[int]]) -> None:
        for i, ids in enumerate(inputs):
            if not ids:
                raise InputTooLongError(f"input {i} is empty")
            if len(ids) > self.n_ctx:
                raise InputTooLongError(f"input {i} has {len(ids)} tokens; an embedding input holds at most {self.n_ctx}")

    def embed(self, inputs: list[list[int]]) -> np.ndarray:
        """(len(inputs), dimensions), unit length, in input order."""
        self.check(inputs)
        out = np.empty((len(inputs), self.dimensions), dtype=np.float32)
        start = 0
        while start < len(inputs):
            end, n_tokens = start, 0
            while (end < len(inputs) and end - start < MAX_INPUTS_PER_DECODE
                   and n_tokens + len(inputs[end]) <= self.n_ctx):
                n_tokens += len(inputs[end])
                end += 1
            out[start:end] = self.context.embed(inputs[start:end])
            start = end
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-12)

    def close(self) -> None:
        self.context.close()
