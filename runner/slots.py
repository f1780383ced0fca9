"""KV slots: one llama.cpp sequence each, with the tokens its cache holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from runner.sequence import Sequence


class SlotState(str, Enum):
    IDLE = "idle"
    PREFILL = "prefill"
    GENERATING = "generating"


@dataclass
class Slot:
    id: int  # == the llama.cpp sequence id
    state: SlotState = SlotState.IDLE
    cached_ids: list[int] = field(default_factory=list)  # invariant: exactly the tokens in this sequence's KV
    seq: Sequence | None = None
    next_token: int | None = None  # sampled, not yet in the KV (fed by the next decode row)
    last_used: int = 0

    @property
    def n_cached(self) -> int:
        return len(self.cached_ids)

    @property
    def is_free(self) -> bool:
        return self.state is SlotState.IDLE

    @property
    def n_prompt_left(self) -> int:
        assert self.seq is not None
        return len(self.seq.prompt_ids) - self.n_cached


def common_prefix_len(a: list[int] | tuple[int, ...], b: list[int] | tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class SlotPool:
    def __init__(self, n_slots: int) -> None:
        self.slots = [Slot(i) for i in range(n_slots)]
        self._clock = 0

    @property
    def n_busy(self) -> int:
        return sum(1 for s in self.slots if not s.is_free)

    def has_free(self) -> bool:
        return any(s.is_free for s in self.slots)

    def pick_for(self, prompt_ids: tuple[int, ...]) -> tuple[Slot, int]:
        """The free slot sharing the longest cached prefix with the prompt (ties: least recently used).

        Returns the slot and how many cached tokens it can keep (always < len(prompt), so the
        last prompt token is decoded again and yields the first logits row)."""
        best, best_keep = None, -1
        for slot in self.slots:
            if not slot.is_free:
                continue
            keep = min(common_prefix_len(slot.cached_ids, prompt_ids), len(prompt_ids) - 1)
            if keep > best_keep or (keep == best_keep and best is not None and slot.last_used < best.last_used):
                best, best_keep = slot, keep
        if best is None:
            raise RuntimeError("pick_for called with no free slot")
        return best, best_keep

    def occupy(self, slot: Slot, seq: Sequence) -> None:
        self._clock += 1
        slot.seq, slot.state, slot.last_used, slot.next_token = seq, SlotState.PREFILL, self._clock, None

    def release(self, slot: Slot) -> None:
        self._clock += 1
        slot.seq, slot.state, slot.last_used, slot.next_token = None, SlotState.IDLE, self._clock, None

    def active(self) -> list[Slot]:
        return [s for s in self.slots if not s.is_free]
