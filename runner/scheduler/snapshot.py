"""What the engine reports about itself: one frozen copy, built on the engine thread.

The server's threads read these (for /slots and /metrics), never the scheduler's or the
speculator's live state, which the engine thread changes in every step."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SlotSnapshot:
    id: int
    state: str
    request_id: str | None
    n_cached: int
    n_generated: int
    n_prompt: int
    n_prompt_reused: int
    draft_k: int  # drafts verified in this slot's last step
    draft_acceptance: float | None  # accepted / proposed for the current (or last) request


@dataclass(frozen=True)
class SlotDrafts:
    """One slot's speculation: drafts in its last step, and its request's record."""

    k: int = 0
    n_proposed: int = 0
    n_accepted: int = 0


@dataclass(frozen=True)
class DraftCounts:
    """Speculation's totals since the engine started, and each slot's."""

    drafter: str
    n_proposed: int
    n_accepted: int
    slots: tuple[SlotDrafts, ...]
    by_kind: tuple[tuple[str, int, int], ...] = ()  # (kind, proposed, accepted) where the drafter has kinds
    gauges: tuple[tuple[str, float], ...] = ()  # what the drafter holds (the n-gram store's size)


@dataclass(frozen=True)
class EngineSnapshot:
    slots: tuple[SlotSnapshot, ...]
    n_waiting: int  # requests queued for a slot
    n_requests: int
    n_prompt_tokens: int  # computed (prefilled)
    n_cached_prompt_tokens: int  # reused from a slot's KV
    n_copied_prompt_tokens: int  # ... of them copied from another slot's KV
    n_generated_tokens: int
    n_steps: int
    decode_s: float
    n_padding_tokens: int  # junk decoded to keep batches invariant (--batch-invariant)
    n_forced_tokens: int  # a grammar's forced tokens decoded as drafts (jump-forward)
    drafts: DraftCounts | None  # None: no speculation
    n_finished: tuple[tuple[str, int], ...] = ()  # generations ended, by reason (stop, length, cancelled, error)

    @property
    def n_busy_slots(self) -> int:
        return sum(1 for s in self.slots if s.state != "idle")
