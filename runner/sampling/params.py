"""What a request asks of sampling: temperature, truncations, penalties, seed, logit bias."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from runner.core.errors import InputError
from runner.core.ranges import is_within, span

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


def checked_sampling(**values: Any) -> SamplingParams:
    """SamplingParams from a caller's keywords (the Python API's), each checked as the server checks
    its fields: InputError naming the first of the wrong type or out of its range. logit_bias may be
    a mapping of token id -> bias (OpenAI's shape) or (id, bias) pairs."""
    for f in fields(SamplingParams):
        if f.name not in values:
            continue
        value = values[f.name]
        if f.name == "seed":
            if value is not None and not _is_whole(value):
                raise InputError(f"seed must be a whole number or None, got {value!r:.80}")
        elif f.name == "logit_bias":
            values[f.name] = _bias_pairs(value)
        else:
            _check_number(f.name, value, whole=f.type == "int", bounds=f.metadata["range"])
    return SamplingParams(**values)


def _is_whole(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_number(name: str, value: Any, whole: bool, bounds: tuple[float | None, float | None]) -> None:
    is_number = _is_whole(value) if whole else isinstance(value, numbers.Real) and not isinstance(value, bool)
    if is_number and is_within(value, *bounds):
        return
    raise InputError(f"{name} must be {'a whole number' if whole else 'a number'} {span(*bounds)}, got {value!r:.80}")


def _bias_pairs(value: Any) -> tuple[tuple[int, float], ...]:
    try:
        pairs = list(value.items()) if isinstance(value, Mapping) else [tuple(p) for p in value]
    except TypeError:
        raise InputError(f"logit_bias must map token ids to biases, got {value!r:.80}") from None
    for pair in pairs:
        if len(pair) != 2 or not _is_whole(pair[0]):
            raise InputError(f"logit_bias must map token ids to biases, got {pair!r:.80}")
        _check_number(f"logit_bias[{pair[0]}]", pair[1], whole=False, bounds=(-100.0, 100.0))
    return tuple((int(t), float(b)) for t, b in pairs)
