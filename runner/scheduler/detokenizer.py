"""Incremental detokenizer: bytes of tokens in, text safe to show out.

Never emits half a UTF-8 character, and holds back text that might be the start of a
stop string until it is sure, so a stop string split across tokens is still cut exactly.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable


class Detokenizer:
    def __init__(self, token_bytes: Callable[[int], bytes], stop: tuple[str, ...] | list[str] = ()) -> None:
        self._token_bytes = token_bytes
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(s for s in stop if s)
        self._held = ""  # decoded text not yet emitted (could begin a stop string)
        self.is_stopped = False
        self.stop_hit: str | None = None
        self.n_decoded = 0  # characters decoded so far (held ones too)
        self.n_released = 0  # characters given out so far (a stop string's cut: where the text ends)

    def push(self, token_id: int) -> str:
        """Feed one token; return the text that can be shown now (maybe '')."""
        if self.is_stopped:
            return ""
        decoded = self._utf8.decode(self._token_bytes(token_id))
        self.n_decoded += len(decoded)
        self._held += decoded
        out = self._release()
        self.n_released += len(out)
        return out

    def flush(self) -> str:
        """End of generation: emit whatever is held (incomplete UTF-8 becomes U+FFFD)."""
        if self.is_stopped:
            return ""
        decoded = self._utf8.decode(b"", final=True)
        self.n_decoded += len(decoded)
        out, self._held = self._held + decoded, ""
        self.n_released += len(out)
        return out

    def _release(self) -> str:
        if not self._stop:
            out, self._held = self._held, ""
            return out
        cut = _first_stop(self._held, self._stop)
        if cut is not None:
            index, stop = cut
            out = self._held[:index]
            self._held, self.is_stopped, self.stop_hit = "", True, stop
            return out
        keep = longest_prefix_tail(self._held, self._stop)
        out = self._held[: len(self._held) - keep]
        self._held = self._held[len(self._held) - keep :]
        return out


def _first_stop(text: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    best: tuple[int, str] | None = None
    for stop in stops:
        index = text.find(stop)
        if index >= 0 and (best is None or index < best[0]):
            best = (index, stop)
    return best


def longest_prefix_tail(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of some stop string (text held back:
    it may still become one)."""
    if not text:
        return 0
    longest, last = 0, text[-1]
    for stop in stops:
        # a tail of n characters can match only where stop[n - 1] is text's last character
        i = stop.rfind(last, 0, min(len(stop) - 1, len(text)))
        while i >= longest:
            if text.endswith(stop[: i + 1]):
                longest = i + 1
                break
            i = stop.rfind(last, 0, i)
    return longest
