"""An image span into a slot's KV: its embeddings encoded ahead (`ready`, on the request's own
thread, so the engine's steps for other slots go on meanwhile) or found in the cache, then one
decode on the engine thread. An image that reaches the engine without them is encoded there."""

from __future__ import annotations

import dataclasses

import numpy as np

from runner.runtime.llama import Context
from runner.runtime.media_cache import MediaCache
from runner.runtime.mtmd import ImageChunk, Projector


class ImageDecoder:
    def __init__(self, projector: Projector, cache_bytes: int) -> None:
        self.projector = projector
        self.cache = MediaCache(cache_bytes)

    def ready(self, image: ImageChunk) -> ImageChunk:
        """The image with its embeddings (kept by content for the next request that sends it)."""
        return dataclasses.replace(image, embeddings=self._embeddings(image))

    def decode(self, context: Context, image: ImageChunk, seq_id: int, first_pos: int) -> int:
        """Returns the position after the span (M-RoPE: first_pos + the chunk's n_pos, not its tokens)."""
        embeddings = image.embeddings if image.embeddings is not None else self._embeddings(image)
        return self.projector.decode(context, image, embeddings, seq_id, first_pos)

    def _embeddings(self, image: ImageChunk) -> np.ndarray:
        embeddings = self.cache.get(image.key)
        if embeddings is None:
            embeddings = self.projector.encode(image)
            self.cache.put(image.key, embeddings)
        return embeddings

    @property
    def n_encodes(self) -> int:
        return self.projector.n_encodes
