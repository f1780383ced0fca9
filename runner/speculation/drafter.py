"""The drafter interface and registry: something that proposes the next tokens of a slot.

A drafter gets one DraftJob per speculating slot and fills in up to `k` proposed tokens,
with the distribution each was drawn from where it has one (None: a point mass), and where it
can, the kind of proposal and its prior acceptance.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from runner.sampling.params import SamplingParams


@dataclass
class DraftJob:
    slot_id: int
    context_ids: list[int]  # everything committed: prompt + output so far, ending with the token to feed next
    k: int  # most tokens wanted
    sampling: SamplingParams
    request_id: str = ""
    draft_ids: list[int] = field(default_factory=list)
    # what kind of proposal this is, where the drafter can tell kinds apart that are accepted at
    # different rates (n-gram: how many context tokens matched); acceptance is learned per kind
    kind: int | None = None
    prior: float | None = None  # the drafter's estimate of acceptance for this kind, before any is measured


class Drafter(Protocol):
    name: str
    is_free: bool  # proposing costs ~nothing (no model): propose first, decide how many to use after

    def propose(self, jobs: list[DraftJob]) -> None: ...

    def catch_up_len(self, slot_id: int, context_ids: list[int]) -> int:
        """Tokens the drafter would have to process before drafting for this slot (0: none)."""
        ...

    def close(self) -> None: ...


def n_common(cached: list[int], context_ids: list[int], limit: int, offset: int = 0) -> int:
    """How many leading tokens of `cached` equal context_ids[offset:] (at most `limit`): what a
    drafter's KV already holds of a slot's context. A whole match is one list comparison (the
    steady state, step after step); only a divergence is walked token by token."""
    limit = min(limit, len(cached))
    if limit <= 0 or cached[:limit] == context_ids[offset : offset + limit]:
        return max(limit, 0)
    n = 0
    while cached[n] == context_ids[n + offset]:
        n += 1
    return n


DrafterFactory = Callable[..., Drafter]
_REGISTRY: dict[str, DrafterFactory] = {}


def register_drafter(name: str, factory: DrafterFactory) -> None:
    """Make `--draft NAME` build this drafter (factory(model=..., n_slots=..., **options))."""
    _REGISTRY[name] = factory


def drafter_names() -> list[str]:
    return sorted(_REGISTRY)


def make_drafter(name: str, **kwargs: object) -> Drafter | None:
    factory = _REGISTRY.get(name)
    return factory(**kwargs) if factory else None
