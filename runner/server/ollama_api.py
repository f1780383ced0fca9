"""Ollama's API (/api/chat, /api/generate): its requests read into the same internal requests as
every dialect's, its replies written back as Ollama's NDJSON objects (streamed by default); and
/api/embed's truncate and dimensions."""

from __future__ import annotations

import datetime
import json
import re
import time
from typing import Any

import numpy as np
from starlette.responses import JSONResponse

from runner.config.keep_alive import parse_keep_alive
from runner.core.errors import OptionError
from runner.prompt.chat_template import Message
from runner.prompt.tools import ShownText, Tool, ToolCall, ToolReading, new_call_id
from runner.sampling.constraints import GrammarSpec
from runner.sampling.params import SamplingParams, value_range
from runner.scheduler.request import FinishReason, StreamEvent, Usage
from runner.server import request_fields
from runner.server.errors import ApiError, invalid
from runner.server.images import ImageParts
from runner.server.params import ChatParams, CommonParams, CompletionParams
from runner.server.reasoning import ReasoningSplitter
from runner.server.replies import piece_of, read_reply, rest_after

NDJSON = "application/x-ndjson"
_DEFAULTS = SamplingParams()
_REPEAT_LAST_N = request_fields.Field("repeat_last_n", "integer", "", *value_range("repeat_last_n"))
_SEED = request_fields.Field("seed", "integer", "", -(2**63), 2**64 - 1)
TRUNCATE = request_fields.Field("truncate", "boolean", "cut each input to what the model embeds at once "
                                "(default true; false: an input too long is a 400)")
DIMENSIONS = request_fields.Field("dimensions", "integer", "the vector's first N values, made unit length again "
                                  "(0 or less, or the model's own size or more: the whole vector, as Ollama)")


def error_response(exc: ApiError) -> JSONResponse:
    """Ollama's envelope: {"error": "..."} with the status."""
    return JSONResponse({"error": exc.message}, status_code=exc.status, headers=exc.headers)


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


# -- requests ----------------------------------------------------------------------------------
def parse_chat(body: dict[str, Any], ctx_size: int) -> ChatParams:
    """/api/chat's body; an empty messages list is a load (or, with keep_alive 0, unload) request."""
    messages = body.get("messages") or []
    if not isinstance(messages, list):
        raise invalid("messages must be a list", "messages")
    images = ImageParts()
    turns = request_fields.system_first([_turn(i, m, images) for i, m in enumerate(messages)])
    tools = _tools(body.get("tools"))
    show_thinking, budget = _think(body.get("think"))
    common = _common(body, ctx_size)
    choice = _tool_choice(body.get("tool_choice"), tools)
    return ChatParams(common=common, messages=turns, tools=tools, tool_choice=choice,
                      show_thinking=show_thinking, thinking_budget=budget, images=tuple(images.images))


def _tool_choice(value: Any, tools: tuple[Tool, ...]) -> str:
    """An extension (Ollama has none: the model decides): OpenAI's auto, none, required or
    {"function": {"name": ...}}, for a model that would not call a tool on its own."""
    choice = value
    if isinstance(value, dict):
        function = value.get("function")
        choice = function.get("name") if isinstance(function, dict) else None
    return request_fields.checked_tool_choice(choice, value, tools)


def parse_generate(body: dict[str, Any], ctx_size: int) -> ChatParams | CompletionParams:
    """/api/generate's body: the prompt as a user turn (with its system), or as-is with raw."""
    prompt = body.get("prompt") or ""
    if not isinstance(prompt, str):
        raise invalid("prompt must be a string", "prompt")
    if body.get("context"):
        raise invalid("'context' is not supported here (send the conversation with /api/chat)", "context")
    images = ImageParts()
    marks = _image_marks(body.get("images"), "images", images)
    common = _common(body, ctx_size)
    if images.images and (body.get("raw") or body.get("template")):
        raise invalid("images go with a templated prompt here (leave out raw and template)", "images")
    suffix = body.get("suffix")
    if suffix:  # fill in the middle: the prompt is the text before the reply, the suffix the text after
        if not isinstance(suffix, str):
            raise invalid("suffix must be a string", "suffix")
        if images.images or body.get("template"):
            raise invalid("suffix fills in the middle of plain text: leave out images and template", "suffix")
        return CompletionParams(common=common, prompts=(prompt,), suffix=suffix)
    if body.get("raw"):
        return CompletionParams(common=common, prompts=(prompt,))
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        raise invalid("system must be a string", "system")
    template = body.get("template")
    if template:
        if not isinstance(template, str):
            raise invalid("template must be a string", "template")
        return CompletionParams(common=common, prompts=(go_template(template, system or "", prompt),))
    prompt = prompt + marks
    turns = ([Message("system", system)] if system else []) + ([Message("user", prompt)] if prompt else [])
    show_thinking, budget = _think(body.get("think"))
    return ChatParams(common=common, messages=turns, show_thinking=show_thinking, thinking_budget=budget,
                      images=tuple(images.images))


_ACTION = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)
_FIELDS = (".System", ".Prompt", ".Response")


def go_template(template: str, system: str, prompt: str) -> str:
    """Ollama's `template` on /api/generate, in the forms apps send: {{ .System }}, {{ .Prompt }},
    {{ .Response }} (empty: the reply follows), {{ if .System }}...{{ else }}...{{ end }} (or
    .Prompt), and the {{- / -}} whitespace trims. Anything else is a 400 naming it."""
    values = {".System": system, ".Prompt": prompt, ".Response": ""}
    out: list[str] = []
    shown = [True]  # one entry per open if/else: whether its text is kept
    trim_next, pos = False, 0
    for match in _ACTION.finditer(template):
        text = template[pos:match.start()]
        text = text.lstrip() if trim_next else text
        if match.group(1):
            text = text.rstrip()
        if all(shown):
            out.append(text)
        action, trim_next, pos = match.group(2), bool(match.group(3)), match.end()
        if action in _FIELDS:
            out.append(values[action] if all(shown) else "")
        elif action.startswith("if ") and action[3:].strip() in _FIELDS:
            shown.append(bool(values[action[3:].strip()]))
        elif action == "else" and len(shown) > 1:
            shown[-1] = not shown[-1]
        elif action == "end" and len(shown) > 1:
            shown.pop()
        else:
            raise invalid(f"template: {{{{ {action} }}}} is not supported here (only .System, .Prompt, .Response, "
                          "and if/else/end on them)", "template")
    if len(shown) > 1:
        raise invalid("template: an {{ if }} has no {{ end }}", "template")
    tail = template[pos:]
    out.append(tail.lstrip() if trim_next else tail)
    return "".join(out)


def keep_alive(body: Any) -> float | None:
    """The request's keep_alive in seconds (math.inf: forever; None: none given)."""
    if not isinstance(body, dict) or body.get("keep_alive") is None:
        return None
    try:
        return parse_keep_alive(body["keep_alive"], "keep_alive")
    except OptionError as exc:
        raise invalid(str(exc), "keep_alive") from None


def is_empty(params: ChatParams | CompletionParams) -> bool:
    """Nothing to generate: Ollama's way to load a model (or unload it, with keep_alive 0)."""
    if isinstance(params, CompletionParams):
        return not params.prompts[0] and not params.suffix
    return not params.messages


def _turn(index: int, message: Any, images: ImageParts) -> Message:
    where = f"messages.{index}"
    if not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant", "tool"):
        raise invalid(f"{where}: role must be system, user, assistant or tool", where)
    content = message.get("content") or ""
    if not isinstance(content, str):
        raise invalid(f"{where}.content must be a string", where)
    content += _image_marks(message.get("images"), f"{where}.images", images)
    tool_calls = message.get("tool_calls") or []
    if not isinstance(tool_calls, list):
        raise invalid(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
    calls = tuple(_call(f"{where}.tool_calls.{j}", c) for j, c in enumerate(tool_calls))
    tool_name = message.get("tool_name")
    return Message(message["role"], content, calls, tool_call_id=tool_name if isinstance(tool_name, str) else None)


def _call(where: str, call: Any) -> ToolCall:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise invalid(f"{where}: a tool call is {{\"function\": {{\"name\", \"arguments\"}}}}", where)
    arguments = function.get("arguments", {})
    return ToolCall(new_call_id(), function["name"], arguments if isinstance(arguments, str) else json.dumps(arguments))


def _image_marks(value: Any, where: str, images: ImageParts) -> str:
    """Ollama's images (base64 strings) after the text they came with."""
    if value is None:
        return ""
    if not isinstance(value, list):
        raise invalid(f"{where} must be a list of base64 strings", where)
    return "".join(images.add_base64(image, f"{where}.{j}") for j, image in enumerate(value))


def _tools(value: Any) -> tuple[Tool, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise invalid("tools must be a list", "tools")
    tools = []
    for i, tool in enumerate(value):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict):
            raise invalid(f"tools.{i} must be {{\"type\": \"function\", \"function\": {{...}}}}", f"tools.{i}")
        tools.append(request_fields.function_tool(function.get("name"), function.get("description"),
                                                  function.get("parameters"), f"tools.{i}"))
    return request_fields.distinct_tools(tools)


def _think(value: Any) -> tuple[bool, int | None]:
    """think: true (or an effort, as gpt-oss takes) shows the thinking; false: the model does not think."""
    if value is None:
        return False, None
    if value is False:
        return False, 0
    if value is True or value in ("low", "medium", "high"):
        return True, None
    raise invalid(f"think must be true, false, low, medium or high, got {json.dumps(value)}", "think")


def _common(body: dict[str, Any], ctx_size: int) -> CommonParams:
    options = body.get("options")
    options = {} if options is None else options
    if not isinstance(options, dict):
        raise invalid("options must be an object", "options")
    options = _whole_floats_as_ints(options)
    stream = body.get("stream", True)
    if not isinstance(stream, bool):
        raise invalid("stream must be a boolean", "stream")
    num_ctx = request_fields.Field("num_ctx", "integer", "", 1).read(options)
    if num_ctx is not None and num_ctx > ctx_size:
        raise invalid(f"num_ctx {num_ctx} is more than a slot holds here ({ctx_size} tokens): start the server with "
                      f"--ctx-size {num_ctx}", "num_ctx")
    num_predict = request_fields.Field("num_predict", "integer", "").read(options)
    stop = request_fields.stop_strings(options.get("stop") or None, "stop")
    return CommonParams(model=request_fields.MODEL.read(body), sampling=_sampling(options),
                        max_tokens=num_predict if num_predict is not None and num_predict > 0 else None,
                        stop=stop, stream=stream, grammar=_format(body.get("format")))


def _whole_floats_as_ints(options: dict[str, Any]) -> dict[str, Any]:
    """JSON has one kind of number, and Ollama (Go) reads 3.0 as an integer option's 3; 3.5 stays a 400 here
    (Ollama would cut it to 3). A number option takes an int as well, so every whole float may become one."""
    return {name: int(value) if isinstance(value, float) and value.is_integer() else value
            for name, value in options.items()}


def _sampling(options: dict[str, Any]) -> SamplingParams:
    values = {name: field.read(options, getattr(_DEFAULTS, name)) for name, field in request_fields.SAMPLING.items()}
    values["repeat_last_n"] = _REPEAT_LAST_N.read(options, _DEFAULTS.repeat_last_n)
    seed = _SEED.read(options)
    values["seed"] = seed if seed is not None and seed >= 0 else None  # a negative seed: random, as llama.cpp's -1
    return SamplingParams(**values)


def _format(value: Any) -> GrammarSpec | None:
    if value in (None, ""):
        return None
    if value == "json":
        return GrammarSpec("json_object", "", "format")
    if isinstance(value, dict):
        return GrammarSpec("json_schema", json.dumps(value), "format")
    raise invalid("format must be \"json\" or a JSON schema", "format")


# -- /api/embed -------------------------------------------------------------------------------
def embed_dimensions(body: dict[str, Any], n_embd: int) -> int | None:
    """The vector size asked for (None: the model's own). Ollama shortens only to a size between 1 and
    the model's own and ignores any other; so does this."""
    n_dimensions = DIMENSIONS.read(body)
    return n_dimensions if n_dimensions is not None and 0 < n_dimensions < n_embd else None


def truncated_ids(ids: list[int], n_max: int, special_ids: list[int]) -> list[int]:
    """An input's tokens cut to n_max (Ollama cuts the text's end). special_ids: the tokenizer's own
    around a text (what it makes of ""); those it put after the text stay last, for a pooling that
    reads the last token (an EOS)."""
    if len(ids) <= n_max:
        return ids
    n_first = 0
    while n_first < len(special_ids) and ids[n_first] == special_ids[n_first]:
        n_first += 1
    end_ids = special_ids[n_first:]
    if not end_ids or ids[-len(end_ids):] != end_ids:
        return ids[:n_max]
    return ids[:n_max - len(end_ids)] + end_ids


def shortened(vector: np.ndarray, n_dimensions: int | None) -> np.ndarray:
    """Ollama's dimensions: the first n values, unit length again (a Matryoshka-trained model's smaller vector)."""
    if n_dimensions is None or n_dimensions == len(vector):
        return vector
    head = vector[:n_dimensions]
    return head / max(float(np.linalg.norm(head)), 1e-12)


# -- replies -----------------------------------------------------------------------------------
def _done_reason(reason: FinishReason | None, has_calls: bool) -> str:
    return "length" if reason is FinishReason.LENGTH and not has_calls else "stop"


class _Timing:
    """Ollama's durations, in nanoseconds: the prompt until the first token, the rest after it."""

    def __init__(self) -> None:
        self.started_ns = time.monotonic_ns()
        self.first_ns: int | None = None
        self.ended_ns: int | None = None

    def saw(self, event: StreamEvent) -> None:
        now = time.monotonic_ns()
        if self.first_ns is None:
            self.first_ns = now
        if event.is_final:
            self.ended_ns = now

    def stats(self, n_prompt: int, usage: Usage | None) -> dict[str, Any]:
        ended = self.ended_ns or time.monotonic_ns()
        first = self.first_ns or ended
        return {"total_duration": max(1, ended - self.started_ns), "load_duration": 0,
                "prompt_eval_count": n_prompt,  # the whole prompt, cached or not, as Ollama counts it
                "prompt_eval_duration": max(1, first - self.started_ns),
                "eval_count": usage.completion_tokens if usage else 0, "eval_duration": max(1, ended - first)}


class OllamaBuilder:
    """One /api/chat or /api/generate reply: NDJSON objects as the text comes, then the final one
    with done, done_reason and the durations; or that final object whole."""

    def __init__(self, model: str, n_prompt: int, is_chat: bool, reasoning: ReasoningSplitter | None = None,
                 tools: ToolReading | None = None, show_thinking: bool = False) -> None:
        self.model, self.n_prompt, self.is_chat = model, n_prompt, is_chat
        self.reasoning, self.tools, self.show_thinking = reasoning, tools, show_thinking
        self.shown = ShownText(tools.syntax) if tools is not None else None  # (what of the text streams)
        self._calls: list[ToolCall] = []  # (read when the reply ends)
        self.timing = _Timing()
        self.text_parts: list[str] = []
        self.finish_reason: FinishReason | None = None
        self.usage: Usage | None = None

    def add(self, event: StreamEvent) -> None:
        self.timing.saw(event)
        self.text_parts.append(event.text)
        if event.is_final:
            self.finish_reason, self.usage = event.finish_reason, event.usage

    def _object(self, content: str, thinking: str = "", calls: tuple[ToolCall, ...] | list[ToolCall] = (),
                done: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "created_at": now_iso()}
        if self.is_chat:
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = [{"function": {"name": c.name, "arguments": json.loads(c.arguments)}}
                                         for c in calls]
            out["message"] = message
        else:
            out["response"] = content
            if thinking:
                out["thinking"] = thinking
        out["done"] = done
        if done:
            out["done_reason"] = _done_reason(self.finish_reason, bool(calls))
            out.update(self.timing.stats(self.n_prompt, self.usage))
        return out

    def whole(self) -> dict[str, Any]:
        reply = read_reply("".join(self.text_parts), self.reasoning, self.tools)
        return self._object(reply.content, reply.reasoning if self.show_thinking else "", reply.calls, done=True)

    # -- the stream ---------------------------------------------------------------------------
    def stream_start(self) -> str:
        return ""

    def chunk_sse(self, event: StreamEvent) -> str | None:
        """The text as it comes (thinking apart); with tools, the text up to where a call may begin,
        the rest and the calls once the reply has ended."""
        self.add(event)
        thinking, content = piece_of(event, self.reasoning, self.shown)
        if not self.show_thinking:
            thinking = ""
        if self.shown is not None:
            if event.is_final:
                reply = read_reply("".join(self.text_parts), self.reasoning, self.tools)
                self._calls = reply.calls
                content += rest_after(reply.content, self.shown.shown)
        return _line(self._object(content, thinking, self._calls)) if content or thinking or self._calls else None

    def stream_error(self, message: str, code: str = "generation_failed") -> str:
        return _line({"error": message})

    def stream_end(self, include_usage: bool) -> str:
        final = self._object("", done=True)
        if self._calls:
            final["done_reason"] = "stop"
        return _line(final)


def _line(data: dict[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False) + "\n"


def loaded_reply(model: str, unloading: bool, is_chat: bool) -> dict[str, Any]:
    """The answer to an empty request: the model is loaded (or, with keep_alive 0, unloads)."""
    out: dict[str, Any] = {"model": model, "created_at": now_iso()}
    if is_chat:
        out["message"] = {"role": "assistant", "content": ""}
    else:
        out["response"] = ""
    return {**out, "done": True, "done_reason": "unload" if unloading else "load"}
