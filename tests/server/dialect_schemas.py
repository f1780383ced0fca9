"""JSON Schemas of the replies as the vendors publish them, written here from the published specs
(the Open Responses schema, openresponses.org; Anthropic's Messages API reference): the objects
and stream events runner sends, with every field those specs mark required. A third-party
compliance tool holds servers to these; test_dialect_schemas holds runner to them."""

from __future__ import annotations

from typing import Any

STRING, INTEGER, NUMBER, BOOLEAN, OBJECT, NULL = ({"type": t} for t in
                                                 ("string", "integer", "number", "boolean", "object", "null"))


def const(value: str) -> dict[str, Any]:
    return {"const": value}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, NULL]}


def strict(properties: dict[str, Any], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """An object whose every property but `optional` is required (others may appear: the specs allow them)."""
    return {"type": "object", "properties": properties, "required": [k for k in properties if k not in optional]}


def array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


# -- Open Responses -----------------------------------------------------------------------------
OUTPUT_TEXT = strict({"type": const("output_text"), "text": STRING, "annotations": array(OBJECT),
                      "logprobs": array(OBJECT)})
ITEM_STATUS = {"enum": ["in_progress", "completed", "incomplete"]}
MESSAGE_ITEM = strict({"type": const("message"), "id": STRING, "status": ITEM_STATUS,
                       "role": {"enum": ["user", "assistant", "system", "developer"]}, "content": array(OUTPUT_TEXT)})
FUNCTION_CALL_ITEM = strict({"type": const("function_call"), "id": STRING, "call_id": STRING, "name": STRING,
                             "arguments": STRING, "status": ITEM_STATUS})
REASONING_ITEM = strict({"type": const("reasoning"), "id": STRING, "summary": array(OBJECT),
                         "content": array(OBJECT), "encrypted_content": STRING},
                        optional=("content", "encrypted_content"))
OUTPUT_ITEM = {"oneOf": [MESSAGE_ITEM, FUNCTION_CALL_ITEM, REASONING_ITEM]}
USAGE = strict({"input_tokens": INTEGER, "output_tokens": INTEGER, "total_tokens": INTEGER,
                "input_tokens_details": strict({"cached_tokens": INTEGER}),
                "output_tokens_details": strict({"reasoning_tokens": INTEGER})})
FUNCTION_TOOL = strict({"type": const("function"), "name": STRING, "description": nullable(STRING),
                        "parameters": nullable(OBJECT), "strict": nullable(BOOLEAN)})
RESPONSE = strict({
    "id": STRING, "object": const("response"), "created_at": INTEGER, "completed_at": nullable(INTEGER),
    "status": STRING, "incomplete_details": nullable(strict({"reason": STRING})), "model": STRING,
    "previous_response_id": nullable(STRING), "instructions": nullable({"anyOf": [STRING, array(OBJECT)]}),
    "output": array(OUTPUT_ITEM), "error": nullable(strict({"code": STRING, "message": STRING})),
    "tools": array(FUNCTION_TOOL),
    "tool_choice": {"anyOf": [{"enum": ["auto", "none", "required"]}, strict({"type": STRING}), OBJECT]},
    "truncation": {"enum": ["auto", "disabled"]}, "parallel_tool_calls": BOOLEAN, "text": OBJECT, "top_p": NUMBER,
    "presence_penalty": NUMBER, "frequency_penalty": NUMBER, "top_logprobs": INTEGER, "temperature": NUMBER,
    "reasoning": nullable(strict({"effort": nullable(STRING), "summary": nullable(STRING)})),
    "user": nullable(STRING), "usage": nullable(USAGE), "max_output_tokens": nullable(INTEGER),
    "max_tool_calls": nullable(INTEGER), "store": BOOLEAN, "background": BOOLEAN, "service_tier": STRING,
    "metadata": {"type": "object", "additionalProperties": STRING}, "safety_identifier": nullable(STRING),
    "prompt_cache_key": nullable(STRING),
})
# the final snapshot of a stream: its status and its usage are settled
FINAL_RESPONSE = {"allOf": [RESPONSE, {"properties": {"status": {"enum": ["completed", "incomplete", "failed"]},
                                                      "completed_at": INTEGER, "usage": USAGE}}]}


def _event(kind: str, **fields: dict[str, Any]) -> dict[str, Any]:
    return strict({"type": const(kind), "sequence_number": INTEGER, **fields})


_AT_ITEM = {"item_id": STRING, "output_index": INTEGER}
_AT_PART = {**_AT_ITEM, "content_index": INTEGER}
RESPONSES_EVENTS = {
    "response.created": _event("response.created", response=RESPONSE),
    "response.in_progress": _event("response.in_progress", response=RESPONSE),
    "response.completed": _event("response.completed", response=FINAL_RESPONSE),
    "response.incomplete": _event("response.incomplete", response=FINAL_RESPONSE),
    "response.failed": _event("response.failed", response=RESPONSE),
    "response.output_item.added": _event("response.output_item.added", output_index=INTEGER, item=OUTPUT_ITEM),
    "response.output_item.done": _event("response.output_item.done", output_index=INTEGER, item=OUTPUT_ITEM),
    "response.content_part.added": _event("response.content_part.added", **_AT_PART, part=OUTPUT_TEXT),
    "response.content_part.done": _event("response.content_part.done", **_AT_PART, part=OUTPUT_TEXT),
    "response.output_text.delta": _event("response.output_text.delta", **_AT_PART, delta=STRING,
                                         logprobs=array(OBJECT)),
    "response.output_text.done": _event("response.output_text.done", **_AT_PART, text=STRING,
                                        logprobs=array(OBJECT)),
    "response.function_call_arguments.delta": _event("response.function_call_arguments.delta", **_AT_ITEM,
                                                     delta=STRING),
    "response.function_call_arguments.done": _event("response.function_call_arguments.done", **_AT_ITEM,
                                                    arguments=STRING),
}

# -- Anthropic Messages -------------------------------------------------------------------------
TEXT_BLOCK = strict({"type": const("text"), "text": STRING, "citations": nullable(array(OBJECT))})
TOOL_USE_BLOCK = strict({"type": const("tool_use"), "id": STRING, "name": STRING, "input": OBJECT})
THINKING_BLOCK = strict({"type": const("thinking"), "thinking": STRING, "signature": STRING})
CONTENT_BLOCK = {"oneOf": [TEXT_BLOCK, TOOL_USE_BLOCK, THINKING_BLOCK]}
ANTHROPIC_USAGE = strict({
    "input_tokens": INTEGER, "output_tokens": INTEGER, "cache_creation_input_tokens": nullable(INTEGER),
    "cache_read_input_tokens": nullable(INTEGER),
    "cache_creation": nullable(strict({"ephemeral_1h_input_tokens": INTEGER, "ephemeral_5m_input_tokens": INTEGER})),
    "server_tool_use": nullable(strict({"web_search_requests": INTEGER})),
    "service_tier": nullable({"enum": ["standard", "priority", "batch"]}),
})
STOP_REASON = nullable({"enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal",
                                 "model_context_window_exceeded"]})
MESSAGE = strict({
    "id": STRING, "type": const("message"), "role": const("assistant"), "content": array(CONTENT_BLOCK),
    "model": STRING, "stop_reason": STOP_REASON, "stop_sequence": nullable(STRING), "usage": ANTHROPIC_USAGE,
    "stop_details": nullable(OBJECT), "container": nullable(OBJECT),
})
DELTA = {"oneOf": [strict({"type": const("text_delta"), "text": STRING}),
                   strict({"type": const("input_json_delta"), "partial_json": STRING}),
                   strict({"type": const("thinking_delta"), "thinking": STRING}),
                   strict({"type": const("signature_delta"), "signature": STRING})]}
MESSAGES_EVENTS = {
    "message_start": strict({"type": const("message_start"), "message": MESSAGE}),
    "ping": strict({"type": const("ping")}),
    "content_block_start": strict({"type": const("content_block_start"), "index": INTEGER,
                                   "content_block": CONTENT_BLOCK}),
    "content_block_delta": strict({"type": const("content_block_delta"), "index": INTEGER, "delta": DELTA}),
    "content_block_stop": strict({"type": const("content_block_stop"), "index": INTEGER}),
    "message_delta": strict({
        "type": const("message_delta"),
        "delta": strict({"stop_reason": STOP_REASON, "stop_sequence": nullable(STRING)}),
        "usage": strict({"output_tokens": INTEGER, "input_tokens": nullable(INTEGER),
                         "cache_creation_input_tokens": nullable(INTEGER), "cache_read_input_tokens": nullable(INTEGER),
                         "server_tool_use": nullable(OBJECT)}),
    }),
    "message_stop": strict({"type": const("message_stop")}),
}
