"""What a request asks of sampling: temperature, truncations, penalties, seed, logit bias."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

GREEDY_EPS = 1e-5


def _in(default: float, lo: float | None, hi: float | None = None) -> Any:
    """A parameter's default and the range a request or a flag may set it in (the API's and the CLI's check)."""
    return field(default=default, metadata={"range": (lo, hi)})


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = _in(0.8, 0.0, 2.0)
    top_k: int = _in(40, 0)
    top_p: float = _in(0.95, 0.0, 1.0)
    min_p: float = _in(0.05, 0.0, 1.0)
    repeat_penalty: float = _in(1.0, 0.01, 10.0)
    repeat_last_n: int = _in(64, 0)
    presence_penalty: float = _in(0.0, -2.0, 2.0)
    frequency_penalty: float = _in(0.0, -2.0, 2.0)
    seed: int | None = None  # (None: a random one; a negative one wraps modulo 2**64)
    # token id -> added to its logit before everything else (-100 bans it, 100 all but forces it);
    # set by the API, not a command-line flag
    logit_bias: tuple[tuple[int, float], ...] = field(default=(), metadata={"cli": False})

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= GREEDY_EPS

    @property
    def has_penalties(self) -> bool:
        return self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def value_range(name: str) -> tuple[float | None, float | None]:
    """The range SamplingParams' field `name` may be set in."""
    return next(f.metadata["range"] for f in fields(SamplingParams) if f.name == name)
