"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`), translated at the
edge: a body becomes the same ChatParams the OpenAI endpoint builds (one generation path), and the
engine's events become Anthropic's message, content blocks and stream events."""

from __future__ import annotations

import json
import secrets
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from runner.prompt.chat_template import Message
from runner.prompt.tools import ShownText, Tool, ToolCall, ToolReading
from runner.sampling.constraints import GrammarSpec
from runner.sampling.params import SamplingParams
from runner.scheduler.request import FinishReason, StreamEvent, Usage
from runner.server import request_fields
from runner.server.errors import ApiError, invalid
from runner.server.images import ImageParts
from runner.server.params import ChatParams, CommonParams
from runner.server.reasoning import ReasoningSplitter
from runner.server.replies import piece_of, read_reply, rest_after
from runner.server.request_fields import Field

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 415: "invalid_request_error",
               429: "rate_limit_error", 503: "overloaded_error"}
TEMPERATURE = Field("temperature", "number", "0: greedy", 0.0, 1.0)  # Anthropic's range; the rest as OpenAI's
_DEFAULTS = SamplingParams()


def api_key(request: Request) -> str | None:
    """Anthropic's clients send the key as x-api-key."""
    return request.headers.get("x-api-key")


# 0: no reply, the prompt read into the cache (Anthropic's way to warm it)
MAX_TOKENS = Field("max_tokens", "integer", "most tokens in the reply (0: none; the prompt is cached)", 0)


def error_response(exc: ApiError) -> JSONResponse:
    kind = ERROR_TYPES.get(exc.status, "api_error")
    return JSONResponse({"type": "error", "error": {"type": kind, "message": _message(exc)}}, status_code=exc.status,
                        headers=exc.headers)


def _message(exc: ApiError) -> str:
    """The error's message; a prompt too long begins as Anthropic words it, which clients read
    (Claude Code compacts its conversation on it)."""
    if exc.too_long is None or not exc.too_long[0]:
        return exc.message
    n_tokens, n_max = exc.too_long
    return f"prompt is too long: {n_tokens} tokens > {n_max} maximum ({exc.message})"


def _text_of(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, dict) and b.get("type") == "text"
                                       and isinstance(b.get("text"), str) for b in value):
        return "".join(b["text"] for b in value)
    raise invalid(f"{where} must be a string or a list of text blocks", where)


def _result_of(value: Any, where: str, images: ImageParts) -> str:
    """A tool result's content: a string, or text and image blocks (a screenshot an agent's tool read)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise invalid(f"{where} must be a string or a list of text and image blocks", where)
    parts = []
    for k, block in enumerate(value):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif kind == "image":
            parts.append(_image(block.get("source"), f"{where}.{k}", images))
        else:
            raise invalid(f"{where}.{k}: a tool result holds text and image blocks, not {json.dumps(kind)}", where)
    return "".join(parts)


def _turns(index: int, message: Any, images: ImageParts) -> list[Message]:
    """One Anthropic message as chat turns: tool results become tool turns, tool uses calls; a
    system message (Claude Code sends them mid-conversation) joins the system text; earlier
    thinking blocks are left out (templates drop a past turn's reasoning)."""
    where = f"messages.{index}"
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system"):
        raise invalid(f"{where}: role must be user, assistant or system", where)
    role, content = message["role"], message.get("content")
    if isinstance(content, str):
        return [Message(role, content)]
    if role == "system":
        return [Message(role, _text_of(content, f"{where}.content"))]
    if not isinstance(content, list):
        raise invalid(f"{where}.content must be a string or a list of content blocks", where)
    texts: list[str] = []
    calls: list[ToolCall] = []
    results: list[Message] = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use" and role == "assistant" and isinstance(block.get("name"), str):
            calls.append(ToolCall(str(block.get("id", "")), block["name"], json.dumps(block.get("input", {}))))
        elif kind == "tool_result" and role == "user" and isinstance(block.get("tool_use_id"), str):
            result = _result_of(block.get("content", ""), f"{where}.content.{j}.content", images)
            if block.get("is_error") is True:  # (else the model cannot tell a failure from a result)
                result = f"Error: {result}"
            results.append(Message("tool", result, tool_call_id=block["tool_use_id"]))
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue
        elif kind == "image":
            texts.append(_image(block.get("source"), f"{where}.content.{j}", images))
        else:
            raise invalid(f"{where}.content.{j}: unsupported content block type {json.dumps(kind)}", where)
    turns = results
    if texts or calls or not results:
        turns = turns + [Message(role, "".join(texts), tuple(calls))]
    return turns


def _image(source: Any, where: str, images: ImageParts) -> str:
    """An image block's source (base64, or a url: a data URI) as a content mark."""
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        return images.add_base64(source.get("data"), where)
    if kind == "url":
        return images.add_url(source.get("url"), where)
    raise invalid(f"{where}: an image's source is {{type: base64, media_type, data}} or {{type: url, url}}", where)


def _tools(value: Any) -> tuple[tuple[Tool, ...], tuple[str, ...]]:
    """The client tools (custom: a name and an input_schema), and the names of those left out: the
    server tools (web_search_*, code_execution_*, ...) and Anthropic-defined client tools (bash_*,
    text_editor_*), whose schemas this server does not have."""
    if value is None:
        return (), ()
    if not isinstance(value, list):
        raise invalid("tools must be a list", "tools")
    tools, ignored = [], []
    for i, tool in enumerate(value):
        fields = tool if isinstance(tool, dict) else {}
        if fields.get("type") not in (None, "custom"):
            ignored.append(str(fields.get("name") or fields.get("type")))
            continue
        tools.append(request_fields.function_tool(fields.get("name"), fields.get("description"),
                                                  fields.get("input_schema"), f"tools.{i}", "input_schema"))
    return request_fields.distinct_tools(tools), tuple(ignored)


def _tool_choice(value: Any, tools: tuple[Tool, ...], ignored: tuple[str, ...]) -> tuple[str, bool]:
    """The tool choice, and whether parallel calls are allowed (disable_parallel_tool_use)."""
    if value is None:
        return request_fields.checked_tool_choice(None, value, tools), True
    kind = value.get("type") if isinstance(value, dict) else None
    choice = value.get("name") if kind == "tool" else {"auto": "auto", "any": "required", "none": "none"}.get(str(kind))
    if choice is None and kind != "tool":
        raise invalid("tool_choice.type must be auto, any, tool or none", "tool_choice")
    if isinstance(choice, str) and choice in ignored:
        raise invalid(f"tool_choice names {json.dumps(choice)}, a tool this server cannot run", "tool_choice")
    disable_parallel = value.get("disable_parallel_tool_use", False)
    if not isinstance(disable_parallel, bool):
        raise invalid("tool_choice.disable_parallel_tool_use must be a boolean", "tool_choice")
    parallel = not disable_parallel
    return request_fields.checked_tool_choice(choice, value, tools, bool(ignored)), parallel


def _thinking(value: Any, output_config: Any) -> tuple[bool, int | None]:
    """`thinking` and `output_config.effort`: whether a reasoning model's thinking comes back as
    thinking blocks (enabled or adaptive: yes; disabled or absent: no), and its budget in tokens:
    enabled's budget_tokens, none when disabled (0), else the effort's (request_fields.EFFORT_BUDGETS).
    On a model that does not reason, neither changes anything."""
    if output_config is not None and not isinstance(output_config, dict):
        raise invalid("output_config must be an object", "output_config")
    effort = (output_config or {}).get("effort")
    if effort is not None and (not isinstance(effort, str) or effort not in request_fields.EFFORT_BUDGETS):
        raise invalid(f"output_config.effort must be one of {', '.join(request_fields.EFFORT_BUDGETS)}",
                      "output_config")
    budget = request_fields.EFFORT_BUDGETS[effort] if effort is not None else None
    if value is None:
        return False, budget
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("enabled", "adaptive", "disabled"):
        raise invalid("thinking.type must be enabled, adaptive or disabled", "thinking")
    if kind == "disabled":
        return False, 0
    if kind == "enabled":
        tokens = value.get("budget_tokens")
        if not request_fields.is_kind(tokens, "integer") or tokens < 0:
            raise invalid("thinking.budget_tokens: a non-negative integer is required when thinking is enabled",
                          "thinking")
        return True, int(tokens)
    return True, budget


def parse_messages(body: dict[str, Any], counting: bool = False) -> ChatParams:
    """An Anthropic request as the internal chat request (count_tokens needs no max_tokens)."""
    max_tokens = MAX_TOKENS.read(body)
    if max_tokens is None and not counting:
        raise invalid("max_tokens: Field required", "max_tokens")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages: a non-empty list of messages is required", "messages")
    images = ImageParts()
    turns = [turn for i, m in enumerate(messages) for turn in _turns(i, m, images)]
    system = body.get("system")
    if system is not None:
        turns.insert(0, Message("system", _text_of(system, "system")))
    turns = request_fields.system_first(turns)
    if not any(t.role != "system" for t in turns):
        raise invalid("messages: at least one user or assistant message is required", "messages")
    stop = body.get("stop_sequences") or []
    if not isinstance(stop, list):
        raise invalid("stop_sequences must be a list of strings", "stop_sequences")
    stop = request_fields.stop_strings(stop, "stop_sequences")
    temperature = TEMPERATURE.read(body, 1.0)
    sampling = SamplingParams(temperature=temperature, top_p=request_fields.SAMPLING["top_p"].read(body, _DEFAULTS.top_p),
                              top_k=request_fields.SAMPLING["top_k"].read(body, _DEFAULTS.top_k))
    tools, ignored = _tools(body.get("tools"))
    choice, parallel = _tool_choice(body.get("tool_choice"), tools, ignored)
    show_thinking, budget = _thinking(body.get("thinking"), body.get("output_config"))
    grammar = _output_format(body)
    stream = request_fields.STREAM.read(body, False)
    common = CommonParams(model=request_fields.MODEL.read(body), sampling=sampling, max_tokens=max_tokens,
                          stop=stop, stream=stream, grammar=grammar)
    return ChatParams(common=common, messages=turns, tools=tools, tool_choice=choice, parallel_tool_calls=parallel,
                      images=tuple(images.images),
                      ignored_tools=ignored, show_thinking=show_thinking, thinking_budget=budget)


def _output_format(body: dict[str, Any]) -> GrammarSpec | None:
    """Structured outputs: `output_config.format` {"type": "json_schema", "schema": {...}} (or the
    structured-outputs beta's top-level `output_format`, the same object) is what the reply's text
    must be (the JSON), as response_format is in OpenAI's API."""
    config = body.get("output_config")
    formats = {"output_config.format": config.get("format") if isinstance(config, dict) else None,
               "output_format": body.get("output_format")}
    given = {param: fmt for param, fmt in formats.items() if fmt is not None}
    if not given:
        return None
    if len(given) > 1 and formats["output_config.format"] != formats["output_format"]:
        raise invalid("output_format and output_config.format differ: give one of them", "output_format")
    param, fmt = next(iter(given.items()))
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise invalid(f'{param} must be {{"type": "json_schema", "schema": {{...}}}}', param)
    return GrammarSpec("json_schema", json.dumps(fmt["schema"]), param)


def _event(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n"


def new_tool_use_id() -> str:
    return "toolu_" + secrets.token_hex(12)


def _empty_block(kind: str) -> dict[str, Any]:
    return {"type": "text", "text": "", "citations": None} if kind == "text" else \
        {"type": "thinking", "thinking": "", "signature": ""}


def _delta(kind: str, text: str) -> dict[str, Any]:
    return {"type": "text_delta", "text": text} if kind == "text" else {"type": "thinking_delta", "thinking": text}


class MessageBuilder:
    """One request's Anthropic response: a whole message, or its stream of events. The message
    carries every field of Anthropic's Message object (null where this server has no value)."""

    def __init__(self, request_id: str, model: str, n_prompt: int, stop_sequences: tuple[str, ...],
                 reasoning: ReasoningSplitter | None, tools: ToolReading | None, show_thinking: bool = False,
                 window_bound: bool = False) -> None:
        """window_bound: the slot holds fewer tokens after the prompt than max_tokens asked for, so a
        reply cut for length was cut by the context window (stop_reason model_context_window_exceeded)."""
        self.message_id = "msg_" + request_id.removeprefix("msg-")
        self.model = model
        self.n_prompt = n_prompt
        self.stop_sequences = stop_sequences
        self.reasoning = reasoning
        self.tools = tools
        self.shown = ShownText(tools.syntax) if tools is not None else None  # (what of the text streams)
        self.show_thinking = show_thinking and reasoning is not None
        self.window_bound = window_bound
        self.text_parts: list[str] = []
        self.finish_reason: FinishReason | None = None
        self.stop_string: str | None = None
        self.usage: Usage | None = None
        self._open: str | None = None  # the kind of the block streaming now: "text" or "thinking"
        self._index = -1  # that block's index
        self._has_text_block = False
        self._reply: tuple[list[dict[str, Any]], bool] | None = None  # the content blocks, once read

    def add(self, event: StreamEvent) -> None:
        self.text_parts.append(event.text)
        if event.is_final:
            self.finish_reason, self.usage, self.stop_string = event.finish_reason, event.usage, event.stop_string

    def _content(self) -> tuple[list[dict[str, Any]], bool]:
        """The reply's content blocks, and whether it called tools (read once, when it has ended)."""
        if self._reply is None:
            self._reply = self._read_content()
        return self._reply

    def _read_content(self) -> tuple[list[dict[str, Any]], bool]:
        reply = read_reply("".join(self.text_parts), self.reasoning, self.tools)
        blocks: list[dict[str, Any]] = []
        if self.show_thinking and reply.reasoning:
            blocks.append({"type": "thinking", "thinking": reply.reasoning, "signature": ""})
        if reply.content or not reply.calls:
            blocks.append({"type": "text", "text": reply.content, "citations": None})
        for call in reply.calls:
            blocks.append({"type": "tool_use", "id": new_tool_use_id(), "name": call.name,
                           "input": json.loads(call.arguments)})
        return blocks, bool(reply.calls)

    def _stop(self, has_calls: bool) -> tuple[str, str | None]:
        if has_calls:
            return "tool_use", None
        if self.finish_reason is FinishReason.LENGTH:
            return ("model_context_window_exceeded" if self.window_bound else "max_tokens"), None
        if self.stop_string is not None and self.stop_string in self.stop_sequences:
            return "stop_sequence", self.stop_string
        return "end_turn", None

    def _usage(self) -> dict[str, Any]:
        usage = self.usage
        cached = usage.cached_tokens if usage else 0  # (Anthropic's input_tokens leaves the cache reads out)
        return {"input_tokens": self.n_prompt - cached, "output_tokens": usage.completion_tokens if usage else 0,
                "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0,
                "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
                "server_tool_use": None, "service_tier": "standard"}

    def _message(self, content: list[dict[str, Any]], stop_reason: str | None,
                 stop_sequence: str | None) -> dict[str, Any]:
        return {"id": self.message_id, "type": "message", "role": "assistant", "model": self.model,
                "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
                "stop_details": None, "container": None, "usage": self._usage()}

    def whole(self) -> dict[str, Any]:
        blocks, has_calls = self._content()
        return self._message(blocks, *self._stop(has_calls))

    # -- the stream ---------------------------------------------------------------------------
    def stream_start(self) -> str:
        return _event("message_start", {"message": self._message([], None, None)}) + _event("ping", {})

    def chunk_sse(self, event: StreamEvent) -> str | None:
        """Thinking (when asked for) and text stream as they come; with tools, the text up to where
        a call may begin, the rest and the calls when the reply ends."""
        self.add(event)
        thought, text = piece_of(event, self.reasoning, self.shown)
        out = self._delta_sse("thinking", thought) if thought and self.show_thinking else ""
        if text:
            out += self._delta_sse("text", text)
        if event.is_final and self.shown is not None:
            out += self._rest_sse()
        return out or None

    def _delta_sse(self, kind: str, text: str) -> str:
        out = ""
        if self._open != kind:
            out += self._close_sse()
            self._open, self._index = kind, self._index + 1
            self._has_text_block = self._has_text_block or kind == "text"
            out += _event("content_block_start", {"index": self._index, "content_block": _empty_block(kind)})
        if not text:
            return out
        return out + _event("content_block_delta", {"index": self._index, "delta": _delta(kind, text)})

    def _close_sse(self) -> str:
        if self._open is None:
            return ""
        out = ""
        if self._open == "thinking":  # a thinking block ends with its signature (none here: nothing is signed)
            out += _event("content_block_delta", {"index": self._index,
                                                  "delta": {"type": "signature_delta", "signature": ""}})
        self._open = None
        return out + _event("content_block_stop", {"index": self._index})

    def _rest_sse(self) -> str:
        """With tools, the end of the stream's blocks: the rest of the text, then the calls."""
        blocks, _ = self._content()
        out = []
        for block in blocks:
            if block["type"] == "text":
                out.append(self._delta_sse("text", rest_after(block["text"], self.shown.shown)))
            elif block["type"] == "tool_use":
                out.append(self._close_sse())
                self._index += 1
                out.append(_event("content_block_start", {"index": self._index,
                                                          "content_block": {**block, "input": {}}}))
                out.append(_event("content_block_delta", {"index": self._index, "delta": {
                    "type": "input_json_delta", "partial_json": json.dumps(block["input"])}}))
                out.append(_event("content_block_stop", {"index": self._index}))
        return "".join(out)

    def stream_error(self, message: str, code: str = "generation_failed") -> str:
        kind = "overloaded_error" if code == "shutting_down" else "api_error"  # (Anthropic's: retry elsewhere)
        return _event("error", {"error": {"type": kind, "message": message}})

    def stream_end(self, include_usage: bool) -> str:
        out = ""
        if self.tools is None and not self._has_text_block:  # a reply always has its text block
            out += self._delta_sse("text", "")
        out += self._close_sse()
        has_calls = self.tools is not None and self._content()[1]
        stop_reason, stop_sequence = self._stop(has_calls)
        usage = self._usage()
        out += _event("message_delta", {"delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence,
                                                  "stop_details": None, "container": None},
                                        "usage": {k: usage[k] for k in ("input_tokens", "output_tokens",
                                                                        "cache_read_input_tokens",
                                                                        "cache_creation_input_tokens",
                                                                        "server_tool_use")}})
        return out + _event("message_stop", {})
