"""OpenAI's Responses API (`POST /v1/responses`, the stateless part), translated at the edge: a body
becomes the same ChatParams the chat endpoint builds (one generation path), and the engine's events
become a Response object with output items, or its typed stream of events.

Stateless: nothing is stored, so `previous_response_id`, `conversation` and `store: true` are
refused by name; a client sends the whole conversation as `input` (as the Agents SDK and Codex do
with `store: false`)."""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from runner.prompt.chat_template import Message
from runner.prompt.tools import ShownText, Tool, ToolCall, ToolReading
from runner.sampling.constraints import GrammarSpec
from runner.sampling.params import SamplingParams
from runner.scheduler.request import FinishReason, StreamEvent, Usage
from runner.server import request_fields
from runner.server.errors import invalid
from runner.server.images import ImageParts
from runner.server.params import ChatParams, CommonParams
from runner.server.reasoning import ReasoningSplitter
from runner.server.replies import piece_of, read_reply, rest_after
from runner.server.request_fields import Field

MAX_OUTPUT_TOKENS = Field("max_output_tokens", "integer", "most tokens in the reply", 1)
PARALLEL_TOOL_CALLS = Field("parallel_tool_calls", "boolean", "allow several calls in one reply")
_DEFAULTS = SamplingParams()
# parameters that need state or features this server does not have: refused unless they ask for nothing
NOT_SUPPORTED = {
    "previous_response_id": lambda v: False, "conversation": lambda v: False, "prompt": lambda v: False,
    "store": lambda v: v is False, "background": lambda v: v is False, "truncation": lambda v: v == "disabled",
    "max_tool_calls": lambda v: False, "top_logprobs": lambda v: v == 0,
}
WHY = {"previous_response_id": "this server stores no responses; send the whole conversation as 'input'",
       "conversation": "this server stores no conversations; send the whole conversation as 'input'",
       "store": "this server stores no responses; send store: false (or leave it out)"}
# `include` values honoured: reasoning items always come back whole (in clear, nothing to encrypt)
INCLUDABLE = {"reasoning.encrypted_content"}
EFFORTS = (None, "none", "minimal", "low", "medium", "high", "xhigh")
SUMMARIES = (None, "auto", "concise", "detailed", "none")


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


# -- the request --------------------------------------------------------------------------------
def _text(value: Any, where: str, images: ImageParts | None = None) -> str:
    """A content: a string, or a list of text parts (input_text, output_text, refusal, text), and
    input_image parts where images are taken (a message's content)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "input_image" and images is not None:
                if part.get("image_url") is None:
                    raise invalid(f"{where}[{j}]: an input_image needs its image_url (a data URI); file ids are "
                                  "not kept here", f"{where}[{j}]")
                texts.append(images.add_url(part.get("image_url"), f"{where}[{j}]"))
                continue
            key = "refusal" if kind == "refusal" else "text"
            if kind not in ("input_text", "output_text", "text", "refusal") or not isinstance(part.get(key), str):
                readable = "text and input_image" if images is not None else "text here"
                raise invalid(f"{where}[{j}]: unsupported content part type {json.dumps(kind)} "
                              f"(this server reads {readable})", f"{where}[{j}]")
            texts.append(part[key])
        return "".join(texts)
    raise invalid(f"{where} must be a string or a list of text parts", where, "invalid_type")


def _messages(value: Any, images: ImageParts) -> list[Message]:
    """`input` as chat turns: messages as they are, function calls folded into the assistant turn
    before them, function call outputs as tool turns; reasoning items from earlier turns dropped."""
    if isinstance(value, str):
        return [Message("user", value)]
    if not isinstance(value, list) or not value:
        raise invalid("'input' must be a string or a non-empty list of items", "input", "invalid_type")
    turns: list[Message] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid(f"{where} must be an object", where, "invalid_type")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise invalid(f"{where}.role must be user, assistant, system or developer; got {json.dumps(role)}",
                              f"{where}.role")
            turns.append(Message("system" if role == "developer" else role, _text(item.get("content"),
                                                                                     f"{where}.content", images)))
        elif kind == "function_call":
            if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
                raise invalid(f"{where}: a function_call needs call_id, name and arguments (strings)", where)
            call = ToolCall(item["call_id"], item["name"], item["arguments"])
            last = turns[-1] if turns else None
            if last is not None and last.role == "assistant":  # several calls (and text) are one turn
                turns[-1] = Message("assistant", last.content, (*last.tool_calls, call))
            else:
                turns.append(Message("assistant", "", (call,)))
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise invalid(f"{where}: a function_call_output needs its call_id", where)
            turns.append(Message("tool", _text(item.get("output"), f"{where}.output"), tool_call_id=item["call_id"]))
        elif kind == "reasoning":
            continue  # the model's own earlier reasoning: templates leave it out of the next prompt
        else:
            raise invalid(f"{where}: unsupported input item type {json.dumps(kind)}", where)
    if not turns:
        raise invalid("'input' holds no message", "input")
    return turns


def _tools(value: Any) -> tuple[tuple[Tool, ...], tuple[str, ...]]:
    """The function tools, and the names of the tools of other kinds (web_search, namespace,
    file_search, mcp, ...): this server cannot run them, so they are left out of the prompt."""
    if value is None:
        return (), ()
    if not isinstance(value, list):
        raise invalid("'tools' must be a list of tools", "tools", "invalid_type")
    tools, ignored = [], []
    for i, tool in enumerate(value):
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise invalid(f"tools[{i}] must be an object with a 'type'", f"tools[{i}]", "invalid_type")
        if tool["type"] != "function":
            ignored.append(str(tool.get("name") or tool["type"]))
            continue
        tools.append(request_fields.function_tool(tool.get("name"), tool.get("description"), tool.get("parameters"),
                                                  f"tools[{i}]"))
    return request_fields.distinct_tools(tools), tuple(ignored)


def _tool_choice(value: Any, tools: tuple[Tool, ...], some_ignored: bool) -> str:
    if value is None or value in ("auto", "none", "required"):
        choice = value
    elif isinstance(value, dict) and value.get("type") == "function":
        choice = value.get("name")
    elif isinstance(value, dict) and isinstance(value.get("type"), str):
        raise invalid(f"'tool_choice' asks for a {json.dumps(value['type'])} tool, which this server cannot run",
                      "tool_choice", "unsupported_parameter")
    else:
        raise invalid("'tool_choice' must be auto, none, required or {\"type\": \"function\", \"name\": ...}",
                      "tool_choice")
    return request_fields.checked_tool_choice(choice, value, tools, some_ignored)


def _reasoning(value: Any) -> dict[str, Any] | None:
    """`reasoning` {effort, summary}: a reasoning model's thinking comes back as a reasoning item
    whatever is asked, bounded by the effort's budget (request_fields.EFFORT_BUDGETS); on a model
    that does not reason neither changes anything. Echoed in the Response."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid("'reasoning' must be an object", "reasoning", "invalid_type")
    effort, summary = value.get("effort"), value.get("summary", value.get("generate_summary"))
    if effort not in EFFORTS:
        raise invalid(f"'reasoning.effort' must be one of {', '.join(e for e in EFFORTS if e)}", "reasoning.effort")
    if summary not in SUMMARIES:
        raise invalid(f"'reasoning.summary' must be one of {', '.join(m for m in SUMMARIES if m)}",
                      "reasoning.summary")
    return {"effort": effort, "summary": summary}


def _grammar(text: Any) -> GrammarSpec | None:
    """`text.format`: text (no constraint), json_object, or json_schema {name, schema, strict}."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise invalid("'text' must be an object", "text", "invalid_type")
    if text.get("verbosity") not in (None, "medium"):
        raise invalid("'text.verbosity' is not supported by this server; leave it out", "text.verbosity",
                      "unsupported_parameter")
    fmt = text.get("format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec("json_object", "", "text.format")
    if kind == "json_schema" and isinstance(fmt.get("name"), str) and isinstance(fmt.get("schema", {}), dict):
        return GrammarSpec("json_schema", json.dumps(fmt.get("schema", {})), "text.format")
    raise invalid("'text.format' must be {\"type\": \"text\" | \"json_object\"} or "
                  "{\"type\": \"json_schema\", \"name\": ..., \"schema\": {...}}", "text.format")


def _refuse_unsupported(body: dict[str, Any]) -> None:
    if body.get("metadata") is not None and not isinstance(body["metadata"], dict):
        raise invalid("'metadata' must be an object of strings", "metadata", "invalid_type")
    for name, asks_nothing in NOT_SUPPORTED.items():
        if body.get(name) is not None and not asks_nothing(body[name]):
            why = WHY.get(name, "not supported by this server; leave it out")
            raise invalid(f"'{name}': {why}", name, "unsupported_parameter")
    include = body.get("include")
    if include is not None:
        if not isinstance(include, list):
            raise invalid("'include' must be a list", "include", "invalid_type")
        for value in include:
            if not isinstance(value, str) or value not in INCLUDABLE:
                raise invalid(f"'include': {json.dumps(value)} is not supported by this server", "include",
                              "unsupported_parameter")


def parse_request(body: dict[str, Any]) -> ChatParams:
    """A Responses request as the internal chat request."""
    _refuse_unsupported(body)
    if body.get("input") is None:
        raise invalid("'input' is required", "input", "missing_required_parameter")
    images = ImageParts()
    turns = _messages(body["input"], images)
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise invalid("'instructions' must be a string", "instructions", "invalid_type")
        turns.insert(0, Message("system", instructions))
    turns = request_fields.system_first(turns)
    if not any(t.role != "system" for t in turns):
        raise invalid("'input' holds no user or assistant message", "input")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise invalid("'stream_options' must be an object", "stream_options", "invalid_type")
    fields = request_fields.SAMPLING
    sampling = SamplingParams(temperature=fields["temperature"].read(body, _DEFAULTS.temperature),
                              top_p=fields["top_p"].read(body, _DEFAULTS.top_p),
                              presence_penalty=fields["presence_penalty"].read(body, 0.0),
                              frequency_penalty=fields["frequency_penalty"].read(body, 0.0))
    effort = (_reasoning(body.get("reasoning")) or {}).get("effort")
    tools, ignored = _tools(body.get("tools"))
    choice = _tool_choice(body.get("tool_choice"), tools, bool(ignored))
    grammar = _grammar(body.get("text"))
    common = CommonParams(model=request_fields.MODEL.read(body), sampling=sampling,
                          max_tokens=MAX_OUTPUT_TOKENS.read(body), stream=request_fields.STREAM.read(body, False),
                          grammar=grammar)
    return ChatParams(common=common, messages=turns, tools=tools, tool_choice=choice,
                      parallel_tool_calls=PARALLEL_TOOL_CALLS.read(body, True), ignored_tools=ignored,
                      thinking_budget=request_fields.EFFORT_BUDGETS[effort] if effort is not None else None,
                      images=tuple(images.images))


def echoed(body: dict[str, Any], params: ChatParams) -> dict[str, Any]:
    """The request's settings as a Response object repeats them."""
    choice = params.tool_choice
    if choice not in ("auto", "none", "required"):
        choice = {"type": "function", "name": choice}
    text = body.get("text") if isinstance(body.get("text"), dict) else {"format": {"type": "text"}}
    sampling = params.common.sampling
    return {
        "previous_response_id": None, "instructions": body.get("instructions"), "metadata": body.get("metadata") or {},
        "max_output_tokens": params.common.max_tokens, "max_tool_calls": None,
        "parallel_tool_calls": params.parallel_tool_calls, "temperature": sampling.temperature,
        "top_p": sampling.top_p, "presence_penalty": sampling.presence_penalty,
        "frequency_penalty": sampling.frequency_penalty, "top_logprobs": 0, "reasoning": _reasoning(body.get("reasoning")),
        "tool_choice": choice, "text": text, "store": False, "background": False, "truncation": "disabled",
        "service_tier": "default", "prompt_cache_key": body.get("prompt_cache_key"),
        "safety_identifier": body.get("safety_identifier"), "user": body.get("user"),
        "tools": [{"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters,
                   "strict": False} for t in params.tools],
    }


# -- the response -------------------------------------------------------------------------------
class ResponsesBuilder:
    """One request's Response: whole, or as its stream of typed events (each with a sequence_number)."""

    def __init__(self, request_id: str, model: str, n_prompt: int, settings: dict[str, Any],
                 reasoning: ReasoningSplitter | None, tools: ToolReading | None) -> None:
        self.response_id = "resp_" + request_id.removeprefix("resp-")
        self.model = model
        self.n_prompt = n_prompt
        self.settings = settings
        self.reasoning = reasoning
        self.tools = tools
        self.shown = ShownText(tools.syntax) if tools is not None else None  # (what of the text streams)
        self.created_at = int(time.time())
        self.text_parts: list[str] = []
        self.finish_reason: FinishReason | None = None
        self.usage: Usage | None = None
        self.output: list[dict[str, Any]] = []  # the items, as streamed (or read whole)
        self._sequence = 0
        self._open: dict[str, Any] | None = None  # the item text is streaming into

    def add(self, event: StreamEvent) -> None:
        self.text_parts.append(event.text)
        if event.is_final:
            self.finish_reason, self.usage = event.finish_reason, event.usage

    def _items(self) -> list[dict[str, Any]]:
        """The whole reply's output items: its reasoning, its text, its calls."""
        reply = read_reply("".join(self.text_parts), self.reasoning, self.tools)
        items = [self._reasoning_item(reply.reasoning)] if reply.reasoning else []
        if reply.content or not reply.calls:
            items.append(self._message_item(reply.content))
        for call in reply.calls:
            items.append({"type": "function_call", "id": new_id("fc"), "call_id": call.id, "name": call.name,
                          "arguments": call.arguments, "status": "completed"})
        return items

    def _reasoning_item(self, text: str) -> dict[str, Any]:
        return {"type": "reasoning", "id": new_id("rs"), "summary": [],
                "content": [{"type": "reasoning_text", "text": text}], "status": "completed"}

    def _message_item(self, text: str) -> dict[str, Any]:
        return {"type": "message", "id": new_id("msg"), "role": "assistant", "status": self._item_status(),
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}

    def _item_status(self) -> str:
        return "incomplete" if self.finish_reason is FinishReason.LENGTH else "completed"

    def _response(self, status: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.response_id, "object": "response", "created_at": self.created_at, "status": status,
            "completed_at": int(time.time()) if status in ("completed", "incomplete") else None,
            "model": self.model, "output": self.output if status != "in_progress" else [],
            "error": None, "incomplete_details": None, "usage": None, **self.settings,
        }
        if status == "incomplete":
            out["incomplete_details"] = {"reason": "max_output_tokens"}
        if self.usage is not None and status != "in_progress":
            out["usage"] = {"input_tokens": self.n_prompt,
                            "input_tokens_details": {"cached_tokens": self.usage.cached_tokens,
                                                     "cache_write_tokens": 0},
                            "output_tokens": self.usage.completion_tokens,
                            "output_tokens_details": {"reasoning_tokens": 0},
                            "total_tokens": self.n_prompt + self.usage.completion_tokens}
        return out

    def _status(self) -> str:
        return "incomplete" if self.finish_reason is FinishReason.LENGTH else "completed"

    def whole(self) -> dict[str, Any]:
        self.output = self._items()
        return self._response(self._status())

    # -- the stream ---------------------------------------------------------------------------
    def _event(self, kind: str, **data: Any) -> str:
        self._sequence += 1
        payload = {"type": kind, "sequence_number": self._sequence - 1, **data}
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def stream_start(self) -> str:
        snapshot = self._response("in_progress")
        return (self._event("response.created", response=snapshot)
                + self._event("response.in_progress", response=snapshot))

    def chunk_sse(self, event: StreamEvent) -> str | None:
        """Text and reasoning stream as they come; with tools, the text up to where a call may begin,
        the rest and the calls when the reply ends."""
        self.add(event)
        thought, text = piece_of(event, self.reasoning, self.shown)
        out = self._delta_sse("reasoning", thought) if thought else ""
        if text:
            out += self._delta_sse("message", text)
        if event.is_final:
            out += self._rest_sse()
        return out or None

    def _rest_sse(self) -> str:
        """The end of the stream's items: the rest of the text (a reply always has its message, unless
        it is only calls), then the calls."""
        rest, calls = "", []  # (without tools all of the text has streamed: nothing to read again)
        if self.shown is not None:
            reply = read_reply("".join(self.text_parts), self.reasoning, self.tools)
            rest, calls = rest_after(reply.content, self.shown.shown), reply.calls
        has_message = any(item["type"] == "message" for item in self.output)
        out = self._delta_sse("message", rest) if rest or not (has_message or calls) else ""
        out += self._close_sse()
        for call in calls:
            out += self._call_sse({"type": "function_call", "id": new_id("fc"), "call_id": call.id,
                                   "name": call.name, "arguments": call.arguments, "status": "completed"})
        return out

    def _delta_sse(self, kind: str, text: str) -> str:
        out = ""
        if self._open is None or self._open["type"] != kind:
            out += self._close_sse()
            item = self._reasoning_item("") if kind == "reasoning" else self._message_item("")
            item["status"] = "in_progress"
            self.output.append(item)
            self._open = item
            index = len(self.output) - 1
            part = item["content"][0]
            out += self._event("response.output_item.added", output_index=index, item={**item, "content": []})
            out += self._event("response.content_part.added", item_id=item["id"], output_index=index,
                               content_index=0, part=dict(part))
        item, index = self._open, len(self.output) - 1
        item["content"][0]["text"] += text
        if not text:
            return out
        if kind == "reasoning":
            return out + self._event("response.reasoning_text.delta", item_id=item["id"], output_index=index,
                                     content_index=0, delta=text)
        return out + self._event("response.output_text.delta", item_id=item["id"], output_index=index,
                                 content_index=0, delta=text, logprobs=[])

    def _close_sse(self) -> str:
        item = self._open
        if item is None:
            return ""
        self._open = None
        index = len(self.output) - 1
        part = item["content"][0]
        item["status"] = "completed" if item["type"] == "reasoning" else self._item_status()
        if item["type"] == "reasoning":
            out = self._event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                              content_index=0, text=part["text"])
        else:
            out = self._event("response.output_text.done", item_id=item["id"], output_index=index,
                              content_index=0, text=part["text"], logprobs=[])
        out += self._event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                           part=part)
        return out + self._event("response.output_item.done", output_index=index, item=item)

    def _call_sse(self, item: dict[str, Any]) -> str:
        self.output.append(item)
        index = len(self.output) - 1
        return (self._event("response.output_item.added", output_index=index,
                            item={**item, "arguments": "", "status": "in_progress"})
                + self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                              delta=item["arguments"])
                + self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                              name=item["name"], arguments=item["arguments"])
                + self._event("response.output_item.done", output_index=index, item=item))

    def stream_error(self, message: str, code: str = "generation_failed") -> str:
        return self._event("error", code=code, message=message, param=None)

    def stream_end(self, include_usage: bool) -> str:
        status = self._status()
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return self._event(kind, response=self._response(status))
