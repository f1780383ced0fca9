"""KV slots: one llama.cpp sequence each, with the tokens its cache holds.

Each slot keeps chained hashes of its cached tokens in blocks of BLOCK_LEN, so finding the
slot (busy or idle) that shares the longest prefix with a prompt compares a few hashes per
slot instead of every token; the winner is then confirmed token by token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from runner.scheduler.sequence import Sequence

BLOCK_LEN = 64
# Copying another slot's KV costs a whole stream copy; below this many extra tokens, recompute.
MIN_COPY_GAIN = 16


class SlotState(str, Enum):
    IDLE = "idle"
    PREFILL = "prefill"
    GENERATING = "generating"
    PARKED = "parked"  # held for a beam search whose first beam is computing the prompt: no rows yet


def block_hashes(token_ids: list[int] | tuple[int, ...], start: int = 0, prev: int = 0) -> list[int]:
    """Chained hashes of the full BLOCK_LEN blocks of token_ids from block `start` on."""
    out = []
    for i in range(start * BLOCK_LEN, len(token_ids) - BLOCK_LEN + 1, BLOCK_LEN):
        prev = hash((prev, tuple(token_ids[i : i + BLOCK_LEN])))
        out.append(prev)
    return out


def common_prefix_len(a: list[int] | tuple[int, ...], b: list[int] | tuple[int, ...], start: int = 0) -> int:
    n = min(len(a), len(b))
    i = start
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class Slot:
    id: int  # == the llama.cpp sequence id
    state: SlotState = SlotState.IDLE
    seq: Sequence | None = None
    next_token: int | None = None  # sampled, not yet in the KV (fed by the next decode row)
    last_used: int = 0
    n_prompt: int = 0  # prompt tokens of the current (or last) request
    n_prompt_reused: int = 0  # of those, how many came from a KV cache instead of being computed
    n_passed_over: int = 0  # steps this prompt waited while other prompts were prefilled
    # invariant: exactly the tokens in this sequence's KV, with hashes of its full blocks
    _cached_ids: list[int] = field(default_factory=list)
    _hashes: list[int] = field(default_factory=list)

    @property
    def cached_ids(self) -> list[int]:
        return self._cached_ids

    @property
    def n_cached(self) -> int:
        return len(self._cached_ids)

    @property
    def is_free(self) -> bool:
        return self.state is SlotState.IDLE

    @property
    def n_prompt_left(self) -> int:
        assert self.seq is not None
        return len(self.seq.prompt_ids) - self.n_cached

    def append(self, token_ids: list[int]) -> None:
        self._cached_ids.extend(token_ids)
        n_full = len(self._cached_ids) // BLOCK_LEN
        if n_full > len(self._hashes):
            prev = self._hashes[-1] if self._hashes else 0
            self._hashes += block_hashes(self._cached_ids, len(self._hashes), prev)

    def truncate(self, n: int) -> None:
        del self._cached_ids[n:]
        del self._hashes[n // BLOCK_LEN :]

    def replace(self, token_ids: list[int] | tuple[int, ...]) -> None:
        self._cached_ids, self._hashes = [], []
        self.append(list(token_ids))

    def prefix_len(self, prompt_ids: tuple[int, ...], prompt_hashes: list[int]) -> int:
        """How many leading prompt tokens this slot's cache holds."""
        n_blocks = 0
        for mine, theirs in zip(self._hashes, prompt_hashes):
            if mine != theirs:
                break
            n_blocks += 1
        start = n_blocks * BLOCK_LEN
        # NOTE: hashes only narrow the search; the tokens decide (a collision must not reuse wrong KV)
        if self._cached_ids[:start] != list(prompt_ids[:start]):
            start = 0
        return common_prefix_len(self._cached_ids, prompt_ids, start)


@dataclass(frozen=True)
class Placement:
    """Where a new request goes: its slot, how many prompt tokens it starts with, and from where."""

    slot: Slot
    n_keep: int
    copy_from: Slot | None = None  # copy this slot's KV (the first n_keep tokens) into `slot`


class SlotPool:
    def __init__(self, n_slots: int) -> None:
        self.slots = [Slot(i) for i in range(n_slots)]
        self._clock = 0
        self._busy: set[int] = set()  # ids of the slots occupied and not yet released

    @property
    def n_busy(self) -> int:
        return len(self._busy)

    @property
    def n_free(self) -> int:
        return len(self.slots) - self.n_busy

    def has_free(self) -> bool:
        return len(self._busy) < len(self.slots)

    def place(self, prompt_ids: tuple[int, ...]) -> Placement:
        """Choose a free slot for a prompt, reusing the longest cached prefix found in ANY slot.

        A free slot that already holds that prefix is used as is; otherwise the least recently
        used free slot is overwritten with a copy of the holder's KV. n_keep is always less than
        the prompt length, so the last prompt token is decoded again and yields logits."""
        free = [s for s in self.slots if s.is_free]
        if not free:
            raise RuntimeError("place() called with no free slot")
        hashes = block_hashes(prompt_ids)
        limit = len(prompt_ids) - 1
        prefix = {s.id: min(s.prefix_len(prompt_ids, hashes), limit) for s in self.slots}
        # whole blocks of prefix first; then a slot next to busy ones (llama.cpp decodes a run of
        # consecutive slots in one graph run, a gap costs another); then an empty slot, then LRU
        own = max(free, key=lambda s: (prefix[s.id] // BLOCK_LEN, self._busy_neighbours(s), prefix[s.id],
                                       s.n_cached == 0, -s.last_used))
        holder = max(self.slots, key=lambda s: prefix[s.id])
        if prefix[holder.id] - prefix[own.id] < MIN_COPY_GAIN:
            return Placement(own, prefix[own.id])
        lru = min(free, key=lambda s: (-self._busy_neighbours(s), s.n_cached > 0, s.last_used))
        return Placement(lru, prefix[holder.id], holder)

    def _busy_neighbours(self, slot: Slot) -> int:
        return sum(1 for i in (slot.id - 1, slot.id + 1) if 0 <= i < len(self.slots) and not self.slots[i].is_free)

    def occupy(self, slot: Slot, seq: Sequence, n_reused: int) -> None:
        self._clock += 1
        slot.seq, slot.state, slot.last_used, slot.next_token = seq, SlotState.PREFILL, self._clock, None
        self._busy.add(slot.id)
        slot.n_prompt, slot.n_prompt_reused, slot.n_passed_over = len(seq.prompt_ids), n_reused, 0

    def release(self, slot: Slot) -> None:
        self._clock += 1
        slot.seq, slot.state, slot.last_used, slot.next_token = None, SlotState.IDLE, self._clock, None
        self._busy.discard(slot.id)

    def active(self) -> list[Slot]:
        """The busy slots, in slot order."""
        return [self.slots[i] for i in sorted(self._busy)]
