"""Which loaded models make room for another: a pure decision from the loaded models' sizes, use
and requests in flight. The least recently used idle model goes first; a pinned model or one with
requests in flight is never chosen; nothing is ever substituted for the model a request named."""

from __future__ import annotations

from dataclasses import dataclass

_MIB = 1 << 20


@dataclass(frozen=True)
class Resident:
    """A loaded (or loading) model, as the decision sees it."""

    name: str
    n_bytes: int  # its memory plan's total
    n_in_flight: int  # requests it is answering (a loading model counts as busy)
    is_pinned: bool
    last_used_s: float  # on the pool's clock


@dataclass(frozen=True)
class Room:
    """The decision: unload `evict` (least recently used first) and load, or refuse with `reason`;
    a transient refusal would succeed once requests in flight end (503 with Retry-After)."""

    evict: tuple[str, ...] = ()
    reason: str | None = None
    is_transient: bool = False

    @property
    def can_load(self) -> bool:
        return self.reason is None


def make_room(name: str, need_bytes: int, free_bytes: int, residents: list[Resident], max_models: int) -> Room:
    """Room for `name` (needing need_bytes) beside `residents`, with free_bytes free now and at
    most max_models loaded (0: no cap)."""
    idle = sorted((r for r in residents if r.n_in_flight == 0 and not r.is_pinned), key=lambda r: r.last_used_s)
    n_over = max(0, len(residents) + 1 - max_models) if max_models else 0
    evict: list[Resident] = []
    for resident in idle:
        if len(evict) >= n_over and free_bytes + _sum(evict) >= need_bytes:
            break
        evict.append(resident)
    if len(evict) >= n_over and free_bytes + _sum(evict) >= need_bytes:
        return Room(tuple(r.name for r in evict))
    busy = [r for r in residents if r.n_in_flight > 0 and not r.is_pinned]
    could_fit = free_bytes + _sum(evict) + _sum(busy) >= need_bytes and len(evict) + len(busy) >= n_over
    if could_fit:
        holders = ", ".join(f"'{r.name}' ({r.n_in_flight} in flight)" for r in busy)
        return Room(reason=f"loading '{name}' needs memory or a place that models answering requests hold: {holders}",
                    is_transient=True)
    pinned = [r.name for r in residents if r.is_pinned]
    if len(evict) + len(busy) < n_over:
        return Room(reason=f"'{name}' cannot load: --max-models {max_models} are loaded and pinned "
                           f"({', '.join(pinned)})")
    held = f" ({', '.join(pinned)} pinned: {_mib(_sum([r for r in residents if r.is_pinned]))})" if pinned else ""
    return Room(reason=f"'{name}' needs {_mib(need_bytes)} but at most {_mib(free_bytes + _sum(evict) + _sum(busy))} "
                       f"can be freed for it{held}")


def _sum(residents: list[Resident]) -> int:
    return sum(r.n_bytes for r in residents)


def _mib(n: int) -> str:
    return f"{n / _MIB:,.0f} MiB"
