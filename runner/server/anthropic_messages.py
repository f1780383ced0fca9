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
from runner.prompt.tools import Tool, ToolCall, ToolReading
from runner.sampling.params import SamplingParams
from runner.scheduler.request import FinishReason, StreamEvent, Usage
from runner.server import request_fields
from runner.server.errors import ApiError, invalid
from runner.server.params import ChatParams, CommonParams
from runner.server.reasoning import ReasoningSplitter
from runner.server.replies import read_reply
from runner.server.request_fields import Field

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 415: "invalid_request_error",
               429: "rate_limit_error", 503: "overloaded_error"}
TEMPERATURE = Field("temperature", "number", "0: greedy", 0.0, 1.0)  # Anthropic's range; the rest as OpenAI's
_DEFAULTS = SamplingParams()


def api_key(request: Request) -> str | None:
    """Anthropic's clients send the key as x-api-key."""
    return request.headers.get("x-api-key")


def error_response(exc: ApiError) -> JSONResponse:
    kind = ERROR_TYPES.get(exc.status, "api_error")
    return JSONResponse({"type": "error", "error": {"type": kind, "message": exc.message}}, status_code=exc.status,
                        headers=exc.headers)


def _text_of(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, dict) and b.get("type") == "text"
                                       and isinstance(b.get("text"), str) for b in value):
        return "".join(b["text"] for b in value)
    raise invalid(f"{where} must be a string or a list of text blocks", where)


def _turns(index: int, message: Any) -> list[Message]:
    """One Anthropic message as chat turns: tool results become tool turns, tool uses calls."""
    where = f"messages.{index}"
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise invalid(f"{where}: role must be user or assistant", where)
    role, content = message["role"], message.get("content")
    if isinstance(content, str):
        return [Message(role, content)]
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
            results.append(Message("tool", _text_of(block.get("content", ""), f"{where}.content.{j}.content"),
                                   tool_call_id=block["tool_use_id"]))
        else:
            raise invalid(f"{where}.content.{j}: unsupported content block type {json.dumps(kind)}", where)
    turns = results
    if texts or calls or not results:
        turns = turns + [Message(role, "".join(texts), tuple(calls))]
    return turns


def _tools(value: Any) -> tuple[Tool, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise invalid("tools must be a list", "tools")
    tools = []
    for i, tool in enumerate(value):
        fields = tool if isinstance(tool, dict) else {}
        tools.append(request_fields.function_tool(fields.get("name"), fields.get("description"), fields.get("input_schema"),
                                            f"tools.{i}", "input_schema"))
    return request_fields.distinct_tools(tools)


def _tool_choice(value: Any, tools: tuple[Tool, ...]) -> str:
    if value is None:
        return request_fields.checked_tool_choice(None, value, tools)
    kind = value.get("type") if isinstance(value, dict) else None
    choice = value.get("name") if kind == "tool" else {"auto": "auto", "any": "required", "none": "none"}.get(str(kind))
    if choice is None and kind != "tool":
        raise invalid("tool_choice.type must be auto, any, tool or none", "tool_choice")
    return request_fields.checked_tool_choice(choice, value, tools)


def parse_messages(body: dict[str, Any], counting: bool = False) -> ChatParams:
    """An Anthropic request as the internal chat request (count_tokens needs no max_tokens)."""
    max_tokens = request_fields.MAX_TOKENS.read(body)
    if max_tokens is None and not counting:
        raise invalid("max_tokens: Field required", "max_tokens")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages: a non-empty list of messages is required", "messages")
    turns = [turn for i, m in enumerate(messages) for turn in _turns(i, m)]
    system = body.get("system")
    if system is not None:
        turns.insert(0, Message("system", _text_of(system, "system")))
    stop = body.get("stop_sequences") or []
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise invalid("stop_sequences must be a list of strings", "stop_sequences")
    temperature = TEMPERATURE.read(body, 1.0)
    sampling = SamplingParams(temperature=temperature, top_p=request_fields.SAMPLING["top_p"].read(body, _DEFAULTS.top_p),
                              top_k=request_fields.SAMPLING["top_k"].read(body, _DEFAULTS.top_k))
    tools = _tools(body.get("tools"))
    stream = request_fields.STREAM.read(body, False)
    common = CommonParams(model=request_fields.MODEL.read(body), sampling=sampling, max_tokens=max_tokens,
                          stop=tuple(s for s in stop if s), stream=stream)
    return ChatParams(common=common, messages=turns, tools=tools, tool_choice=_tool_choice(body.get("tool_choice"), tools))


def _event(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data}, ensure_ascii=False)}\n\n"


def new_tool_use_id() -> str:
    return "toolu_" + secrets.token_hex(12)


class MessageBuilder:
    """One request's Anthropic response: a whole message, or its stream of events."""

    def __init__(self, request_id: str, model: str, n_prompt: int, stop_sequences: tuple[str, ...],
                 reasoning: ReasoningSplitter | None, tools: ToolReading | None) -> None:
        self.message_id = "msg_" + request_id.removeprefix("msg-")
        self.model = model
        self.n_prompt = n_prompt
        self.stop_sequences = stop_sequences
        self.reasoning = reasoning
        self.tools = tools
        self.text_parts: list[str] = []
        self.finish_reason: FinishReason | None = None
        self.stop_string: str | None = None
        self.usage: Usage | None = None
        self._block_open = False
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
        reply = read_reply("".join(self.text_parts), self.reasoning, self.tools)  # (reasoning left out here)
        text, calls = reply.content, reply.calls
        blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text or not calls else []
        for call in calls:
            blocks.append({"type": "tool_use", "id": new_tool_use_id(), "name": call.name,
                           "input": json.loads(call.arguments)})
        return blocks, bool(calls)

    def _stop(self, has_calls: bool) -> tuple[str, str | None]:
        if has_calls:
            return "tool_use", None
        if self.finish_reason is FinishReason.LENGTH:
            return "max_tokens", None
        if self.stop_string is not None and self.stop_string in self.stop_sequences:
            return "stop_sequence", self.stop_string
        return "end_turn", None

    def _usage(self) -> dict[str, int]:
        usage = self.usage
        return {"input_tokens": self.n_prompt, "output_tokens": usage.completion_tokens if usage else 0,
                "cache_read_input_tokens": usage.cached_tokens if usage else 0, "cache_creation_input_tokens": 0}

    def whole(self) -> dict[str, Any]:
        blocks, has_calls = self._content()
        stop_reason, stop_sequence = self._stop(has_calls)
        return {"id": self.message_id, "type": "message", "role": "assistant", "model": self.model,
                "content": blocks, "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": self._usage()}

    # -- the stream ---------------------------------------------------------------------------
    def stream_start(self) -> str:
        message = {"id": self.message_id, "type": "message", "role": "assistant", "model": self.model,
                   "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": self.n_prompt, "output_tokens": 0}}
        return _event("message_start", {"message": message}) + _event("ping", {})

    def chunk_sse(self, event: StreamEvent) -> str | None:
        """Text streams as it comes (reasoning left out); with tools the reply is sent when it ends."""
        self.add(event)
        if self.tools is not None:
            return self._tool_blocks_sse() if event.is_final else None
        text = event.text
        if self.reasoning is not None:
            _, text = self.reasoning.push(text)
            if event.is_final:
                text += self.reasoning.flush()[1]
        out = ""
        if text:
            if not self._block_open:
                out += _event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
                self._block_open = True
            out += _event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": text}})
        return out or None

    def _tool_blocks_sse(self) -> str:
        blocks, _ = self._content()
        out = []
        for i, block in enumerate(blocks):
            if block["type"] == "text":
                out.append(_event("content_block_start", {"index": i, "content_block": {"type": "text", "text": ""}}))
                out.append(_event("content_block_delta", {"index": i, "delta": {"type": "text_delta",
                                                                                "text": block["text"]}}))
            else:
                start = {**block, "input": {}}
                out.append(_event("content_block_start", {"index": i, "content_block": start}))
                out.append(_event("content_block_delta", {"index": i, "delta": {
                    "type": "input_json_delta", "partial_json": json.dumps(block["input"])}}))
            out.append(_event("content_block_stop", {"index": i}))
        return "".join(out)

    def stream_error(self, message: str) -> str:
        return _event("error", {"error": {"type": "api_error", "message": message}})

    def stream_end(self, include_usage: bool) -> str:
        out = ""
        if self.tools is None:
            if not self._block_open:  # an empty reply still has its one text block
                out += _event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
            out += _event("content_block_stop", {"index": 0})
        has_calls = self.tools is not None and self._content()[1]
        stop_reason, stop_sequence = self._stop(has_calls)
        out += _event("message_delta", {"delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                                        "usage": {"output_tokens": self._usage()["output_tokens"]}})
        return out + _event("message_stop", {})

