"""How long an idle model stays loaded: `--keep-alive` and a request's `keep_alive`, written as
Ollama writes them (seconds as a number, or "30s", "5m", "1h", "1h30m"; 0: unload when the last
request ends; negative: never)."""

from __future__ import annotations

import math
import re

from runner.core.errors import OptionError

FOREVER = math.inf
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_keep_alive(value: object, what: str = "--keep-alive") -> float:
    """Seconds an idle model is kept (math.inf: forever); OptionError naming `what` otherwise."""
    if isinstance(value, bool):
        raise OptionError(f"{what} must be a duration such as 30m, 300 or -1, got {value!r}")
    if isinstance(value, (int, float)) and math.isfinite(value):
        return FOREVER if value < 0 else float(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return parse_keep_alive(float(text), what)
        except ValueError:
            pass
        sign, body = (-1, text[1:]) if text.startswith("-") else (1, text)
        parts = _PART.findall(body)
        if body and parts and "".join(n + u for n, u in parts) == body:
            seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
            return FOREVER if sign < 0 else seconds
    raise OptionError(f"{what} must be a duration such as 30m, 300 or -1, got {value!r}")


def describe(seconds: float) -> str:
    if seconds == FOREVER:
        return "forever"
    return f"{seconds:g}s" if seconds < 120 else f"{seconds / 60:g}m"
