"""Function calling: the tools a request offers, how its model writes a call, and reading calls back.

A model family writes calls in its own syntax, recognized from its chat template:
- Hermes / Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (one block per call);
- Llama 3.x: a bare JSON object `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`;
- Mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`.
A template that knows no tools gets them described in a system message and is asked for the
Hermes syntax (the fallback format, documented in the README). With tool_choice "required" or a
named function the reply is constrained to a call whose arguments follow the function's schema.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from runner.core.json_schemas import closed_objects, map_subschemas

HERMES, LLAMA3, MISTRAL = "hermes", "llama3", "mistral"
# where a call begins in each syntax: with tool_choice auto the grammar takes over from there
TRIGGERS = {HERMES: "<tool_call>", LLAMA3: '{"name"', MISTRAL: "[TOOL_CALLS]"}
FALLBACK_PROMPT = (
    "You can call these functions. To call one, reply with only\n"
    '<tool_call>{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}</tool_call>\n'
    "Functions:\n{functions}"
)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]  # a JSON schema for the arguments object

    def as_openai(self) -> dict[str, Any]:
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def syntax_of(template_source: str | None) -> str:
    """Which call syntax a chat template teaches its model (Hermes when it shows none)."""
    source = template_source or ""
    if "[TOOL_CALLS]" in source:
        return MISTRAL
    if "<|python_tag|>" in source or "ipython" in source:
        return LLAMA3
    return HERMES


def template_knows_tools(template_source: str | None) -> bool:
    return bool(template_source) and "tools" in template_source  # type: ignore[operator]


def fallback_system_prompt(tools: list[Tool]) -> str:
    lines = [json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters}) for t in tools]
    return FALLBACK_PROMPT.format(functions="\n".join(lines))


def _call_schema(tools: list[Tool], arguments_key: str) -> dict[str, Any]:
    options, definitions = [], {}
    for i, tool in enumerate(tools):
        name = f"tool{i}"
        definitions[name] = _rebased(closed_objects(tool.parameters) or {"type": "object"}, f"#/$defs/{name}")
        options.append({"type": "object",
                        "properties": {"name": {"const": tool.name}, arguments_key: {"$ref": f"#/$defs/{name}"}},
                        "required": ["name", arguments_key], "additionalProperties": False})
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    return {**schema, "$defs": definitions}


def _rebased(schema: Any, base: str) -> Any:
    """A tool's parameters held at `base` in the call's schema: their root-relative references (#,
    #/properties/x, #/$defs/X: recursive tools, pydantic's models) moved below base, so they still
    mean the parameters and not the call. Only schemas are walked: a "$ref" key in a data value
    (const, enum, default, examples) is data."""
    if not isinstance(schema, dict):
        return schema
    out = map_subschemas(schema, lambda keyword, pointer, sub: _rebased(sub, base))
    ref = schema.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):  # (not "#name": an anchor)
        out["$ref"] = base + ref[1:]
    return out


def call_grammar(syntax: str, tools: list[Tool], parallel: bool, json_layout: dict[str, Any] | None = None,
                 reply_schema: dict[str, Any] | None = None) -> str:
    """A Lark grammar (llguidance) for a reply that is only calls to these tools (json_layout: the
    JSON compiler's options, e.g. no free whitespace), or, given a reply_schema (a request's JSON
    reply format beside its tools), either calls or JSON that follows it. Lenient for the calls: a
    keyword of a tool's schema the compiler does not implement (Claude Code's tools use
    propertyNames) is not enforced, where a strict compile would refuse the whole request; the
    client checks the arguments it gets anyway."""
    key = "parameters" if syntax == LLAMA3 else "arguments"
    schema = json.dumps({**_call_schema(tools, key), "x-guidance": {**(json_layout or {}), "lenient": True}})
    if syntax == MISTRAL:
        more = ' ("," " " call)*' if parallel else ""
        calls = f'"[TOOL_CALLS]" "[" call{more} "]"'
    elif syntax == LLAMA3:
        calls = "call"
    else:
        calls = "block+" if parallel else "block"
    rules = [f"start: {calls}" if reply_schema is None else f"start: reply | {calls}"]
    if reply_schema is not None:
        rules.append(f"reply: %json {json.dumps({**reply_schema, 'x-guidance': json_layout or {}})}")
    if syntax == HERMES:
        rules.append('block: "<tool_call>" call "</tool_call>"')
    rules.append(f"call: %json {schema}")
    return "\n".join(rules) + "\n"


HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
_HERMES_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def _calls_from(objects: list[Any], arguments_key: str, names: set[str]) -> list[ToolCall]:
    calls = []
    for obj in objects:
        if not isinstance(obj, dict) or obj.get("name") not in names:
            return []
        arguments = obj.get(arguments_key, obj.get("arguments", {}))
        calls.append(ToolCall(new_call_id(), obj["name"], json.dumps(arguments, ensure_ascii=False)))
    return calls


def parse_calls(syntax: str, text: str, tools: list[Tool]) -> tuple[str, list[ToolCall]]:
    """The reply's calls (to tools it was offered) and the text outside them; no calls: (text, [])."""
    names = {t.name for t in tools}
    stripped = text.strip()
    try:
        if syntax == MISTRAL and stripped.startswith("[TOOL_CALLS]"):
            calls = _calls_from(json.loads(stripped.removeprefix("[TOOL_CALLS]")), "arguments", names)
            return ("", calls) if calls else (text, [])
        if syntax == LLAMA3:
            body = stripped.removeprefix("<|python_tag|>").strip()
            if body.startswith("{"):
                calls = _calls_from([json.loads(body)], "parameters", names)
                return ("", calls) if calls else (text, [])
            return text, []
        blocks = _HERMES_BLOCK.findall(text)
        if blocks:
            calls = _calls_from([json.loads(b) for b in blocks], "arguments", names)
            if calls:
                return _HERMES_BLOCK.sub("", _before_a_cut_call(text)).strip(), calls
    except (json.JSONDecodeError, TypeError, AttributeError):
        pass
    return _before_a_cut_call(text).lstrip() if syntax == HERMES else text, []


def _before_a_cut_call(text: str) -> str:
    """The text before a call that never closed (the reply was cut inside it, or inside its tag at
    the very end): not content."""
    text = text[:len(text) - _opening_part(text, HERMES_OPEN)]
    cut = text.rfind(HERMES_OPEN)
    return text if cut < 0 or HERMES_CLOSE in text[cut:] else text[:cut]


def _opening_part(text: str, opener: str) -> int:
    """The length of text's longest end that begins opener (and is not all of it)."""
    return next((n for n in range(min(len(text), len(opener) - 1), 0, -1) if opener.startswith(text[-n:])), 0)


class ShownText:
    """The part of a reply that may hold calls that can be shown while it streams: its text up to
    where a call may begin. What it shows is always the start of the text outside the calls that
    parse_calls reads from the whole reply, so the rest can follow once the reply has ended.
    Hermes: the text, leading whitespace left out, up to a `<tool_call>` or what may begin one,
    holding back whitespace (the text before a call ends without it). Llama 3 and Mistral: a call
    is the whole reply, so all of it once it cannot begin one, else nothing. It keeps only what it
    has not shown yet (a reply's rest is read from the whole reply)."""

    def __init__(self, syntax: str) -> None:
        self._syntax = syntax
        self._pieces: list[str] = []  # what it showed
        self._pending = ""  # what came and is not shown yet
        self._held = False  # a call (may have) begun: nothing more until the end
        self._free = False  # nothing held back any more (Llama 3, Mistral: no call)

    @property
    def shown(self) -> str:
        return "".join(self._pieces)

    def push(self, text: str) -> str:
        """What of the reply's next text can be shown now."""
        if self._held:
            return ""
        if self._free:
            out = text
        else:
            self._pending += text
            out = self._hermes() if self._syntax == HERMES else self._whole_reply()
        if out:
            self._pieces.append(out)
        return out

    def _hermes(self) -> str:
        pending = self._pending if self._pieces else self._pending.lstrip()
        at = pending.find(HERMES_OPEN)
        if at >= 0:
            self._held, self._pending = True, ""
            return pending[:at].rstrip()
        out = pending[:len(pending) - _opening_part(pending, HERMES_OPEN)].rstrip()
        self._pending = pending[len(out):]
        return out

    def _whole_reply(self) -> str:
        start = self._pending.lstrip()
        openers = ("{", "<|python_tag|>") if self._syntax == LLAMA3 else ("[TOOL_CALLS]",)
        if any(start.startswith(o) for o in openers):
            self._held, self._pending = True, ""
            return ""
        if not start or any(o.startswith(start) for o in openers):
            return ""
        self._free = True
        out, self._pending = self._pending, ""
        return out


@dataclass(frozen=True)
class ToolReading:
    """How to read one reply's calls: the model's syntax and the tools it was offered."""

    syntax: str
    tools: tuple[Tool, ...]

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        return parse_calls(self.syntax, text, list(self.tools))
