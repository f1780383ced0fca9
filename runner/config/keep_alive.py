"""How long an idle model stays loaded: `--keep-alive` and a request's `keep_alive`, written as
Ollama writes them (seconds as a number, or "30s", "5m", "1h", "1h30m"; 0: unload when the last
request ends; negative: never)."""

from __future__ import annotations

import math
import re

from runner.core.errors import OptionError

FOREVER = math.inf
# Ollama's longest duration (2**63 - 1 ns, about 292 years): a longer keep-alive is forever, since no
# clock or date can say when it would end
LONGEST_S = (2**63 - 1) / 1e9
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_keep_alive(value: object, what: str = "--keep-alive") -> float:
    """Seconds an idle model is kept (math.inf: forever); OptionError naming `what` otherwise."""
    if isinstance(value, bool):
        raise OptionError(f"{what} must be a duration such as 30m, 300 or -1, got {value!r}")
    if isinstance(value, int):  # (compared as it is: an integer past a float's range overflows float())
        return FOREVER if value < 0 or value > LONGEST_S else float(value)
    if isinstance(value, float) and not math.isnan(value):
        return _kept_s(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return parse_keep_alive(float(text), what)
        except ValueError:
            pass
        sign, body = (-1, text[1:]) if text.startswith("-") else (1, text)
        parts = _PART.findall(body)
        if body and parts and "".join(n + u for n, u in parts) == body:
            return _kept_s(sign * sum(float(n) * _UNIT_S[u] for n, u in parts))
    raise OptionError(f"{what} must be a duration such as 30m, 300 or -1, got {value!r}")


def _kept_s(seconds: float) -> float:
    return FOREVER if seconds < 0 or seconds > LONGEST_S else seconds


def describe(seconds: float) -> str:
    if seconds == FOREVER:
        return "forever"
    return f"{seconds:g}s" if seconds < 120 else f"{seconds / 60:g}m"
