"""What every dialect's parser shares: the JSON body reader, scalar fields declared once (read and
documented from the same declaration), the served-model check and the function-tool readers."""

from __future__ import annotations

import json
import math
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any

from runner.prompt.chat_template import Message
from runner.prompt.tools import Tool
from runner.sampling.params import value_range
from runner.server.errors import ApiError, invalid
from runner.server.guards import MAX_JSON_DEPTH, check_json_value


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; nesting, huge integers and lone surrogates are refused here."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise invalid(f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        raise invalid(f"the request body nests deeper than {MAX_JSON_DEPTH} levels", code="invalid_json") from None
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise invalid(f"the request body holds a value that cannot be read: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object", code="invalid_json")
    check_json_value(body)
    return body


@dataclass(frozen=True)
class Field:
    """One scalar request parameter, declared once: the parser reads it and /openapi.json
    (server/openapi.py) documents it from this declaration."""

    name: str
    kind: str  # its JSON type: "number", "integer", "boolean" or "string"
    description: str
    lo: float | None = None
    hi: float | None = None

    def read(self, body: dict, default: Any = None) -> Any:
        value = body.get(self.name)
        if value is None:
            return default
        if not is_kind(value, self.kind):
            article = "an" if self.kind[0] in "aeiou" else "a"
            raise invalid(f"'{self.name}' must be {article} {self.kind}, got {json.dumps(value)}", self.name,
                          "invalid_type")
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            bound = f"between {self.lo} and {self.hi}" if self.hi is not None else f"at least {self.lo}"
            raise invalid(f"'{self.name}' must be {bound}, got {value}", self.name)
        return float(value) if self.kind == "number" else value

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.kind, "description": self.description}
        if self.lo is not None:
            out["minimum"] = self.lo
        if self.hi is not None:
            out["maximum"] = self.hi
        return out


def is_kind(value: Any, kind: str) -> bool:
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) if kind == "integer" else math.isfinite(value)


MODEL = Field("model", "string", "the served model id or an alias (required, as OpenAI's API has it)")
STREAM = Field("stream", "boolean", "stream the reply as server-sent events")
MAX_TOKENS = Field("max_tokens", "integer", "most tokens in the reply (the older name)", 1)
SAMPLING = {  # SamplingParams field -> its request parameter (the dialects that take one name it so)
    name: Field(name, kind, description, *value_range(name)) for name, kind, description in (
        ("temperature", "number", "0: greedy"),
        ("top_k", "integer", "keep the k most likely tokens (0: off)"),
        ("top_p", "number", "nucleus sampling threshold"),
        ("min_p", "number", "drop tokens below min_p x the top probability"),
        ("repeat_penalty", "number", "penalty for recently seen tokens"),
        ("presence_penalty", "number", "OpenAI presence penalty"),
        ("frequency_penalty", "number", "OpenAI frequency penalty"))
}


MAX_STOP_CHARS = 1000  # each stop string is looked for after every token, on the engine thread
MAX_STOP_STRINGS = 64  # where the dialect sets no count of its own (OpenAI's is 4)


def stop_strings(value: Any, param: str, max_count: int = MAX_STOP_STRINGS) -> tuple[str, ...]:
    """A dialect's stop strings (one string or a list of them; None: none), empty ones dropped."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise invalid(f"'{param}' must be a string or a list of strings", param, "invalid_type")
    if len(value) > max_count:
        raise invalid(f"'{param}' takes at most {max_count} strings, got {len(value)}", param)
    if any(len(s) > MAX_STOP_CHARS for s in value):
        raise invalid(f"'{param}': a stop string may be at most {MAX_STOP_CHARS} characters long", param)
    return tuple(s for s in value if s)


def check_model(requested: str | None, served: list[str]) -> str:
    """The served id the request names: as written, or `NAME:latest` as NAME where no model is named
    so (Ollama's default tag: the same model there, and apps write it)."""
    if requested is None:
        raise invalid(f"'model' is required; this server serves: {', '.join(served)}", "model",
                      "missing_required_parameter")
    if requested in served:
        return requested
    untagged = requested.removesuffix(":latest")
    if untagged != requested and untagged in served:
        return untagged
    raise ApiError(
        404, f"The model '{requested}' does not exist; this server serves: {', '.join(served)}",
        param="model", code="model_not_found",
    )


TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def function_tool(name: Any, description: Any, parameters: Any, where: str, params_key: str = "parameters") -> Tool:
    """One function tool, whatever the dialect's wrapping; `where` is its path in the request, for errors."""
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        raise invalid(f"{where}.name must be 1-64 letters, digits, _ or -", f"{where}.name")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise invalid(f"{where}.{params_key} must be a JSON schema object", f"{where}.{params_key}", "invalid_type")
    return Tool(name, description if isinstance(description, str) else "", parameters)


def distinct_tools(tools: list[Tool]) -> tuple[Tool, ...]:
    if len({t.name for t in tools}) < len(tools):
        raise invalid("'tools' names a function twice", "tools")
    return tuple(tools)


def checked_tool_choice(choice: Any, value: Any, tools: tuple[Tool, ...], some_ignored: bool = False) -> str:
    """A dialect's tool choice read as auto, none, required or a tool's name, checked against the
    tools; `value` is what the request sent (None: nothing, the default), quoted in errors;
    `some_ignored`: tools were left out (of kinds this server cannot run), so auto with none left
    is none."""
    if value is None or (choice == "auto" and not tools and some_ignored):
        return "auto" if tools else "none"
    if not isinstance(choice, str):
        raise invalid(f"tool_choice {json.dumps(value)}: the tool's name must be a string", "tool_choice")
    if choice not in ("auto", "none", "required") and choice not in {t.name for t in tools}:
        raise invalid(f"tool_choice names {json.dumps(choice)}, which is not among the tools", "tool_choice")
    if choice != "none" and not tools:
        raise invalid(f"tool_choice {json.dumps(value)} needs 'tools'", "tool_choice")
    return choice


IGNORED_TOOLS_HEADER = "x-runner-ignored-tools"  # names the request's tools this server left out


def ignored_tools_header(ignored: tuple[str, ...]) -> dict[str, str]:
    """The reply's header naming the tools left out of the prompt (none: no header); each name
    percent-encoded where it is not plain ASCII (a header is latin-1), the list cut at 4 KB."""
    if not ignored:
        return {}
    names = [urllib.parse.quote(name, safe="_-.:/@") for name in ignored]
    value = ", ".join(names)
    while len(value) > 4096:  # whole names only, and a mark that some are missing
        names.pop()
        value = ", ".join(names) + ", ..."
    return {IGNORED_TOOLS_HEADER: value}


def system_first(turns: list[Message]) -> list[Message]:
    """Every system (and developer) turn, wherever it stood, joined in order into one system turn
    at the start: chat templates take one system message, first; the agents send several."""
    system = [t.content for t in turns if t.role == "system" and t.content]
    rest = [t for t in turns if t.role != "system"]
    return ([Message("system", "\n\n".join(system))] if system else []) + rest


# a reasoning effort as a thinking budget in tokens (None: no limit): none and minimal skip the
# thinking, low and medium bound it, high and above leave it to the model
EFFORT_BUDGETS: dict[str, int | None] = {"none": 0, "minimal": 0, "low": 1024, "medium": 4096, "high": None,
                                         "xhigh": None, "max": None}
