"""What a request asks of sampling: temperature, truncations, penalties, seed, logit bias."""

from __future__ import annotations

from dataclasses import dataclass, field

GREEDY_EPS = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    # token id -> added to its logit before everything else (-100 bans it, 100 all but forces it);
    # set by the API, not a command-line flag
    logit_bias: tuple[tuple[int, float], ...] = field(default=(), metadata={"cli": False})

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= GREEDY_EPS

    @property
    def has_penalties(self) -> bool:
        return self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
