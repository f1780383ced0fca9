"""An image span into a slot's KV: its embeddings from the cache or the encoder, then one decode."""

from __future__ import annotations

from runner.runtime.llama import Context
from runner.runtime.media_cache import MediaCache
from runner.runtime.mtmd import ImageChunk, Projector


class ImageDecoder:
    def __init__(self, projector: Projector, cache_bytes: int) -> None:
        self.projector = projector
        self.cache = MediaCache(cache_bytes)

    def decode(self, context: Context, image: ImageChunk, seq_id: int, first_pos: int) -> None:
        embeddings = self.cache.get(image.key)
        if embeddings is None:
            embeddings = self.projector.encode(image)
            self.cache.put(image.key, embeddings)
        self.projector.decode(context, image, embeddings, seq_id, first_pos)

    @property
    def n_encodes(self) -> int:
        return self.projector.n_encodes
