"""A number's allowed range, checked and said the same way by flags, options and the Python API."""

from __future__ import annotations

import math


def is_within(value: float, lo: float | None, hi: float | None) -> bool:
    return math.isfinite(value) and (lo is None or value >= lo) and (hi is None or value <= hi)


def span(lo: float | None, hi: float | None) -> str:
    if lo is not None and hi is not None:
        return f"from {lo:g} to {hi:g}"
    return f"at least {lo:g}" if lo is not None else f"at most {hi:g}" if hi is not None else "a finite number"
