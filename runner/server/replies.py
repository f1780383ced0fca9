"""What every dialect's reply builder shares: a streamed piece's reasoning and text, the whole reply
read back (reasoning, text, tool calls) and the server-sent event framing."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runner.prompt.tools import ShownText, ToolCall, ToolReading
from runner.scheduler.request import StreamEvent
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


def piece_of(event: StreamEvent, reasoning: ReasoningSplitter | None,
             shown: ShownText | None) -> tuple[str, str]:
    """(reasoning, text) of an event that can be sent now: the reasoning split off (the last event
    takes what the splitter held back), the text up to where a call may begin when tools are offered."""
    thought, text = ("", event.text) if reasoning is None else reasoning.push(event.text)
    if event.is_final and reasoning is not None:
        more_thought, more_text = reasoning.flush()
        thought, text = thought + more_thought, text + more_text
    return thought, text if shown is None else shown.push(text)


def rest_after(content: str, shown: str) -> str:
    """What of a reply's text is still to send once `shown` was sent while it streamed (ShownText:
    always the start of the text; were it not, what follows the part they share)."""
    return content[len(os.path.commonprefix([content, shown])):]


def sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"
