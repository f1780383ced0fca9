"""A scripted stand-in for the llama.cpp runtime: next token = last token + 1 (mod vocab)."""

from __future__ import annotations

import numpy as np

from runner.scheduler.batch import BatchRow

N_VOCAB = 50
EOG_ID = 0


class FakeRuntime:
    def __init__(self) -> None:
        self.kv: dict[int, list[int]] = {}
        self.batches: list[list[tuple[int, list[int], int, int]]] = []
        self.copies: list[tuple[int, int]] = []
        self.n_padding_tokens = 0
        self.forgotten: set[int] = set()  # sequences whose cached prefix a sliding window has let go of
        self.checkpoints: dict[int, int] = {}  # the prompt end a sequence can still continue from

    def decode(self, rows: list[BatchRow]) -> list[np.ndarray]:
        self.batches.append([(r.seq_id, list(r.token_ids), r.first_pos, r.n_logits) for r in rows])
        out: list[np.ndarray] = []
        for r in rows:
            kv = self.kv.setdefault(r.seq_id, [])
            assert len(kv) == r.first_pos, "positions must continue the cached sequence"
            kv.extend(r.token_ids)
            logits = np.zeros((r.n_logits, N_VOCAB), dtype=np.float32)
            for i, token_id in enumerate(r.token_ids[len(r.token_ids) - r.n_logits:]):  # each predicts its token + 1
                logits[i, (token_id + 1) % N_VOCAB] = 1.0
            out.append(logits)
        return out

    def kv_remove(self, seq_id: int, p0: int = 0, p1: int = -1) -> bool:
        assert p1 == -1
        del self.kv.setdefault(seq_id, [])[p0:]
        if self.checkpoints.get(seq_id, -1) > p0:
            del self.checkpoints[seq_id]
        return True

    def kv_copy_all(self, src_seq: int, dst_seq: int) -> None:
        self.kv[dst_seq] = list(self.kv.get(src_seq, []))
        self.copies.append((src_seq, dst_seq))

    def usable_prefix(self, seq_id: int, n_keep: int, copied: bool = False) -> int:
        if seq_id not in self.forgotten:
            return n_keep
        if copied:  # (a checkpoint does not restore across a copy)
            return 0
        return self.checkpoints[seq_id] if self.checkpoints.get(seq_id, n_keep + 1) <= n_keep else 0

    def checkpoint(self, seq_id: int, n_tokens: int) -> None:
        self.checkpoints[seq_id] = n_tokens

    # the Vocab protocol
    def token_bytes(self, token_id: int) -> bytes:
        return f"<{token_id}>".encode()

    @property
    def eog_ids(self) -> frozenset[int]:
        return frozenset({EOG_ID})


class ScriptedGrammar:
    """A stand-in for a request's grammar (sampling.constraints.Constraint): it allows exactly the
    tokens of `script`, one after another (each the only continuation, so all of them are forced),
    then anything."""

    def __init__(self, script: list[int]) -> None:
        self.left = list(script)

    @property
    def is_active(self) -> bool:
        return True

    @property
    def current(self) -> ScriptedGrammar:
        return self

    def mask_into(self, logits: np.ndarray) -> None:
        if self.left:
            allowed = logits[self.left[0]]
            logits[:] = -np.inf
            logits[self.left[0]] = allowed

    def advance(self, token_id: int) -> None:
        if self.left:
            assert token_id == self.left.pop(0), "a token the grammar does not allow"

    def n_valid(self, token_ids: list[int]) -> int:
        for i, token_id in enumerate(token_ids):
            if i < len(self.left) and token_id != self.left[i]:
                return i
        return len(token_ids)

    def forced_tokens(self) -> list[int]:
        return list(self.left)
