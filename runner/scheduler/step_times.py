"""What a step of n tokens takes on this machine, learnt from the engine's own steps.

The scheduler asks it one question: is a step's time mostly a fixed cost (a GPU, or a large model
read from memory once per step: more tokens are nearly free) or mostly per token (a small model
on a CPU: every token costs its share of compute)? That decides whether prompts waiting for their
first token are prefilled together or one after another (Scheduler._prefill_slots).
"""

from __future__ import annotations

from dataclasses import dataclass, field

WEIGHT = 0.2  # of the newest step in its size class's running mean


@dataclass(frozen=True)
class StepLine:
    """seconds(n) ~= fixed_s + per_token_s * n"""

    fixed_s: float
    per_token_s: float


@dataclass
class StepTimes:
    """Running mean seconds per size class of step (1, 2-3, 4-7, ... tokens); a line fitted
    through the classes seen."""

    _classes: dict[int, tuple[float, float]] = field(default_factory=dict)  # class -> (mean tokens, mean s)

    def observe(self, n_tokens: int, seconds: float) -> None:
        if n_tokens <= 0 or seconds <= 0:
            return
        key = n_tokens.bit_length()
        old = self._classes.get(key)
        if old is None:
            self._classes[key] = (float(n_tokens), seconds)
        else:
            self._classes[key] = (old[0] + WEIGHT * (n_tokens - old[0]), old[1] + WEIGHT * (seconds - old[1]))

    def line(self) -> StepLine | None:
        """Least squares through the size classes' means (each class one point, so the many small
        decode steps do not outweigh the few prefill steps); None until two classes are known."""
        points = list(self._classes.values())
        if len(points) < 2:
            return None
        mean_n = sum(n for n, _ in points) / len(points)
        mean_s = sum(s for _, s in points) / len(points)
        var = sum((n - mean_n) ** 2 for n, _ in points)
        per_token = max(0.0, sum((n - mean_n) * (s - mean_s) for n, s in points) / var)
        return StepLine(max(0.0, mean_s - per_token * mean_n), per_token)
