"""A store of n-grams that learns across requests: every token a model generates, in any slot,
teaches it what followed the n tokens before it; drafts for any slot then chain its predictions.
Replies that repeat across requests (boilerplate, the same code, an agent's fixed phrasing) are
drafted even when the request's own context never contained them.

Bounded: a fixed table of `n_entries` hashed n-grams (the memory is allocated once, up front);
an entry is overwritten only after its token has lost more often than it was confirmed. It holds
what the model wrote for every user of this server; it never leaves the process, and it is per
model (each LoadedModel has its own).
"""

from __future__ import annotations

import numpy as np

STORE_N = 4  # tokens of context per key
BYTES_PER_ENTRY = 4 + 4 + 1  # key check, token, confidence
_CONFIDENCE_MAX = 7


class NgramStore:
    def __init__(self, n_bytes: int, n: int = STORE_N) -> None:
        n_entries = 1 << max(4, (max(n_bytes, 1) // BYTES_PER_ENTRY).bit_length() - 1)  # a power of two
        self.n = n
        self._mask = n_entries - 1
        self._check = np.zeros(n_entries, dtype=np.uint32)  # the key's other hash bits (0: empty)
        self._token = np.zeros(n_entries, dtype=np.int32)
        self._confidence = np.zeros(n_entries, dtype=np.uint8)
        self.n_filled = 0

    @property
    def n_entries(self) -> int:
        return self._mask + 1

    @property
    def n_bytes(self) -> int:
        return self._check.nbytes + self._token.nbytes + self._confidence.nbytes

    def _slot(self, key: tuple[int, ...]) -> tuple[int, int]:
        h = hash(key) & 0xFFFF_FFFF_FFFF_FFFF
        return h & self._mask, ((h >> 32) & 0xFFFF_FFFF) or 1

    def learn(self, ids: list[int], start: int) -> None:
        """Each token ids[p] for p >= start (and p >= n) followed ids[p-n:p]."""
        for p in range(max(start, self.n), len(ids)):
            self.add(tuple(ids[p - self.n : p]), ids[p])

    def add(self, key: tuple[int, ...], token: int) -> None:
        i, check = self._slot(key)
        if self._check[i] == check and self._token[i] == token:
            self._confidence[i] = min(_CONFIDENCE_MAX, int(self._confidence[i]) + 1)
        elif self._check[i] == 0 or self._confidence[i] == 0:
            self.n_filled += self._check[i] == 0
            self._check[i], self._token[i], self._confidence[i] = check, token, 1
        else:  # another n-gram (or another continuation) holds it: it loses some confidence
            self._confidence[i] -= 1

    def predict(self, key: tuple[int, ...]) -> int | None:
        i, check = self._slot(key)
        return int(self._token[i]) if self._check[i] == check else None

    def draft(self, context: list[int], k: int) -> list[int]:
        """Up to k tokens, each predicted from the n before it (the context's, then the drafts')."""
        if len(context) < self.n:
            return []
        window, out = list(context[-self.n :]), []
        while len(out) < k:
            token = self.predict(tuple(window))
            if token is None:
                break
            out.append(token)
            window = window[1:] + [token]
        return out
