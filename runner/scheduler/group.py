"""A request's sequences as the scheduler sees them together: one alone (ALONE), n choices of one
prompt (Choices), or one beam search (beam.BeamSearch). Every member carries the same group, and
the scheduler asks it, never what kind it is: whether the head of the queue may take a slot, what
starts beside it, who decides a row's tokens, and whom a cancel or a failure ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

import numpy as np

# The members' type (sequence.Sequence): a parameter, since sequence.py imports this module.
Member = TypeVar("Member")


class GroupSlot(Protocol):
    """What a group sees of the slots it holds (slots.Slot)."""

    id: int
    next_token: int | None

    @property
    def n_cached(self) -> int: ...
    @property
    def cached_ids(self) -> list[int]: ...
    def replace(self, token_ids: list[int] | tuple[int, ...]) -> None: ...


class KvCopy(Protocol):
    def kv_remove(self, seq_id: int, p0: int = 0, p1: int = -1) -> bool: ...
    def kv_copy_all(self, src_seq: int, dst_seq: int) -> None: ...


class Group(Protocol[Member]):
    # its members' rows go to `collect`, and `advance` chooses all their next tokens after the step
    # (False: each member's row is sampled and verified on its own)
    decides_together: bool
    is_done: bool

    @property
    def slot_ids(self) -> tuple[int, ...]:
        """The slots it holds as one (a failure in one ends them all); () when each member is on its own."""
        ...

    def can_admit(self, seq: Member, n_free_slots: int) -> bool:
        """May seq, first in the queue, take a slot now? (False: it waits, and so does the queue.)"""
        ...

    def start(self, slot: GroupSlot, park: Callable[[Member], GroupSlot]) -> None:
        """A member took `slot`; a group that starts whole parks its other members (park: a slot each)."""
        ...

    def collect(self, slot: GroupSlot, row: np.ndarray) -> None:
        """A member's logits row, kept until `advance` (only where decides_together)."""
        ...

    def advance(self, kv: KvCopy, n_ctx_per_slot: int) -> list[GroupSlot]:
        """After the step's rows: choose the members' next tokens; returns the slots to release."""
        ...

    def cancel(self) -> None:
        """One member was cancelled: the others that end with it are marked too."""
        ...


class Alone:
    """The null group: each member is scheduled on its own, as if it had no group."""

    decides_together = False
    is_done = False
    slot_ids: tuple[int, ...] = ()

    def can_admit(self, seq: object, n_free_slots: int) -> bool:
        return True

    def start(self, slot: GroupSlot, park: object) -> None:
        pass

    def collect(self, slot: GroupSlot, row: np.ndarray) -> None:
        raise AssertionError("a member on its own samples its rows itself")

    def advance(self, kv: KvCopy, n_ctx_per_slot: int) -> list[GroupSlot]:
        return []

    def cancel(self) -> None:
        pass


ALONE = Alone()


class HasPrompt(Protocol):
    @property
    def is_prompt_computed(self) -> bool: ...


class Choices(Alone):
    """n choices of one prompt: the first computes it; the others wait until it is in the KV, so that
    their slots copy it instead of computing it again."""

    def __init__(self, first: HasPrompt) -> None:
        self.first = first

    def can_admit(self, seq: object, n_free_slots: int) -> bool:
        return seq is self.first or self.first.is_prompt_computed
