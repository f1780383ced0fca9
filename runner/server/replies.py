"""What every dialect's reply builder shares: the whole reply read back (reasoning, text, tool
calls) and the server-sent event framing."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runner.prompt.tools import ToolCall, ToolReading
from runner.server.reasoning import ReasoningSplitter, split_whole

TokenText = Callable[[int], bytes]


@dataclass(frozen=True)
class Reply:
    """A whole reply as a dialect reports it: the reasoning, the text, the tool calls."""

    reasoning: str
    content: str
    calls: list[ToolCall]


def read_reply(text: str, reasoning: ReasoningSplitter | None, tools: ToolReading | None) -> Reply:
    """The reasoning split off first (when the server splits it), then calls read from the rest."""
    thought, content = split_whole(text, reasoning.starts_inside) if reasoning is not None else ("", text)
    calls: list[ToolCall] = []
    if tools is not None:
        content, calls = tools.parse(content)
    return Reply(thought, content, calls)


def rest_after(content: str, shown: str) -> str:
    """What of a reply's text is still to send once `shown` was sent while it streamed (ShownText:
    always the start of the text; were it not, what follows the part they share)."""
    if content.startswith(shown):
        return content[len(shown):]
    n_same = next((i for i, (a, b) in enumerate(zip(content, shown)) if a != b), min(len(content), len(shown)))
    return content[n_same:]


def sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"
