"""A reasoning model's reply, split as it streams: what it writes inside <think>…</think> at the
start is `reasoning_content`, the rest is `content` (as llama.cpp's server and DeepSeek's API do).

Templates of such models (DeepSeek-R1, some Qwen3 modes) may open the tag in the prompt, so the
reply starts inside it. A tag split across streamed pieces is held back until it is sure.
"""

from __future__ import annotations

from enum import Enum

from runner.scheduler.detokenizer import longest_prefix_tail

OPEN, CLOSE = "<think>", "</think>"
FORMATS = ("deepseek", "none")  # --reasoning-format: split into reasoning_content, or keep the text inline


class _State(Enum):
    START = "start"  # the reply may still open with the tag
    INSIDE = "inside"  # reasoning
    AFTER = "after"  # just closed: blanks before the answer are dropped
    CONTENT = "content"


class ReasoningSplitter:
    def __init__(self, starts_inside: bool = False) -> None:
        self.starts_inside = starts_inside
        self._state = _State.INSIDE if starts_inside else _State.START
        self._held = ""

    def push(self, text: str) -> tuple[str, str]:
        """(reasoning, content) of this piece, given everything before it."""
        text, self._held = self._held + text, ""
        reasoning = ""
        if self._state is _State.START:
            stripped = text.lstrip()
            if stripped.startswith(OPEN):
                self._state, text = _State.INSIDE, stripped[len(OPEN):]
            elif OPEN.startswith(stripped):  # blanks, or a tag still arriving
                self._held = text
                return "", ""
            else:
                self._state = _State.CONTENT
        if self._state is _State.INSIDE:
            end = text.find(CLOSE)
            if end < 0:
                n_held = longest_prefix_tail(text, (CLOSE,))
                self._held = text[len(text) - n_held:]
                return text[: len(text) - n_held], ""
            reasoning, text, self._state = text[:end], text[end + len(CLOSE):], _State.AFTER
        if self._state is _State.AFTER:
            text = text.lstrip()
            if not text:
                return reasoning, ""
            self._state = _State.CONTENT
        return reasoning, text

    def flush(self) -> tuple[str, str]:
        """What was held back, at the end of the reply."""
        held, self._held = self._held, ""
        return (held, "") if self._state is _State.INSIDE else ("", held)

    @property
    def is_plain(self) -> bool:
        """Past the reasoning and holding nothing: text now passes straight through as content."""
        return self._state is _State.CONTENT and not self._held


def split_whole(text: str, starts_inside: bool = False) -> tuple[str, str]:
    splitter = ReasoningSplitter(starts_inside)
    reasoning, content = splitter.push(text)
    more_reasoning, more_content = splitter.flush()
    return reasoning + more_reasoning, content + more_content
