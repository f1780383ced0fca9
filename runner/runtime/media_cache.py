"""Encoded images kept by content: an image whose KV is gone is decoded again without encoding."""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np


class MediaCache:
    """An LRU of embeddings by content key, bounded in bytes (0: keeps nothing)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.n_bytes = 0
        self.n_hits = 0
        self._entries: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()  # requests' threads encode ahead while the engine decodes

    def get(self, key: str) -> np.ndarray | None:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                self.n_hits += 1
            return found

    def put(self, key: str, embeddings: np.ndarray) -> None:
        with self._lock:
            if key in self._entries or embeddings.nbytes > self.max_bytes:
                return
            self._entries[key] = embeddings
            self.n_bytes += embeddings.nbytes
            while self.n_bytes > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self.n_bytes -= dropped.nbytes

    def __len__(self) -> int:
        return len(self._entries)
