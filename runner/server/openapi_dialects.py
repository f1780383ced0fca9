"""The OpenAPI paths of the other dialects: OpenAI's Responses (`/v1/responses`) and Anthropic's
Messages (`/v1/messages`, `/v1/messages/count_tokens`). Request bodies from the parsers' own
declarations where they have them; replies as the builders write them (every field the published
schemas require, null where this server has no value)."""

from __future__ import annotations

from typing import Any

from runner.server import anthropic_messages, openai_responses, request_fields
from runner.server.openapi_schema import nullable, object_schema


def _open(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """An object that may carry other properties too (the vendors' objects grow)."""
    return object_schema(properties, required, extra=True)


STRING, INTEGER, NUMBER, BOOLEAN = ({"type": t} for t in ("string", "integer", "number", "boolean"))
TYPED_ITEM = _open({"type": STRING}, ["type"])  # an input item, tool or block: its `type` says which

# -- Responses ----------------------------------------------------------------------------------
RESPONSES_BODY = _open({
    "model": request_fields.MODEL.schema(),
    "input": {"oneOf": [STRING, {"type": "array", "items": {"type": "object"}, "minItems": 1}]},
    "instructions": STRING,
    "max_output_tokens": openai_responses.MAX_OUTPUT_TOKENS.schema(),
    "temperature": request_fields.SAMPLING["temperature"].schema(), "top_p": request_fields.SAMPLING["top_p"].schema(),
    "presence_penalty": request_fields.SAMPLING["presence_penalty"].schema(),
    "frequency_penalty": request_fields.SAMPLING["frequency_penalty"].schema(),
    "stream": request_fields.STREAM.schema(),
    "tools": {"type": "array", "items": TYPED_ITEM,
              "description": "function tools go into the prompt; tools of other types are left out (named in the "
                             "x-runner-ignored-tools header)"},
    "tool_choice": {"oneOf": [{"type": "string", "enum": ["auto", "none", "required"]},
                              _open({"type": {"type": "string", "enum": ["function"]}, "name": STRING},
                                      ["type", "name"])]},
    "parallel_tool_calls": openai_responses.PARALLEL_TOOL_CALLS.schema(),
    "reasoning": _open({"effort": nullable({"type": "string", "enum": [e for e in openai_responses.EFFORTS if e]}),
                          "summary": nullable({"type": "string",
                                                "enum": [s for s in openai_responses.SUMMARIES if s]})}, []),
    "text": {"type": "object"},
    "store": {"type": "boolean", "enum": [False], "description": "nothing is stored here"},
    "include": {"type": "array", "items": {"type": "string", "enum": sorted(openai_responses.INCLUDABLE)}},
    "metadata": {"type": "object", "additionalProperties": STRING},
    "prompt_cache_key": STRING, "safety_identifier": STRING, "user": STRING,
}, ["model", "input"])
OUTPUT_ITEM = _open({"type": {"type": "string", "enum": ["message", "function_call", "reasoning"]},
                       "id": STRING}, ["type", "id"])
RESPONSE = _open({
    "id": STRING, "object": {"type": "string", "enum": ["response"]}, "created_at": INTEGER,
    "completed_at": nullable(INTEGER), "status": {"type": "string", "enum": ["completed", "incomplete", "failed"]},
    "incomplete_details": nullable({"type": "object"}), "model": STRING, "previous_response_id": nullable(STRING),
    "instructions": nullable(STRING), "output": {"type": "array", "items": OUTPUT_ITEM},
    "error": nullable({"type": "object"}), "tools": {"type": "array", "items": TYPED_ITEM},
    "tool_choice": {"oneOf": [STRING, {"type": "object"}]}, "truncation": {"type": "string", "enum": ["disabled"]},
    "parallel_tool_calls": BOOLEAN, "text": {"type": "object"}, "top_p": NUMBER, "presence_penalty": NUMBER,
    "frequency_penalty": NUMBER, "top_logprobs": INTEGER, "temperature": NUMBER,
    "reasoning": nullable({"type": "object"}), "user": nullable(STRING),
    "usage": nullable(_open({"input_tokens": INTEGER, "output_tokens": INTEGER, "total_tokens": INTEGER,
                                "input_tokens_details": {"type": "object"},
                                "output_tokens_details": {"type": "object"}},
                               ["input_tokens", "output_tokens", "total_tokens"])),
    "max_output_tokens": nullable(INTEGER), "max_tool_calls": nullable(INTEGER), "store": BOOLEAN,
    "background": BOOLEAN, "service_tier": STRING, "metadata": {"type": "object"},
    "safety_identifier": nullable(STRING), "prompt_cache_key": nullable(STRING),
}, ["id", "object", "created_at", "completed_at", "status", "incomplete_details", "model", "previous_response_id",
    "instructions", "output", "error", "tools", "tool_choice", "truncation", "parallel_tool_calls", "text", "top_p",
    "presence_penalty", "frequency_penalty", "top_logprobs", "temperature", "reasoning", "user", "usage",
    "max_output_tokens", "max_tool_calls", "store", "background", "service_tier", "metadata", "safety_identifier",
    "prompt_cache_key"])

# -- Messages -----------------------------------------------------------------------------------
MESSAGES_BODY = _open({
    "model": request_fields.MODEL.schema(),
    "messages": {"type": "array", "minItems": 1, "items": _open({
        "role": {"type": "string", "enum": ["user", "assistant", "system"]},
        "content": {"oneOf": [STRING, {"type": "array", "items": TYPED_ITEM}]}}, ["role", "content"])},
    "system": {"oneOf": [STRING, {"type": "array", "items": _open({"type": {"type": "string", "enum": ["text"]},
                                                                        "text": STRING}, ["type", "text"])}]},
    "max_tokens": anthropic_messages.MAX_TOKENS.schema(),
    "temperature": anthropic_messages.TEMPERATURE.schema(), "top_p": request_fields.SAMPLING["top_p"].schema(),
    "top_k": request_fields.SAMPLING["top_k"].schema(),
    "stop_sequences": {"type": "array", "items": STRING}, "stream": request_fields.STREAM.schema(),
    "tools": {"type": "array", "items": {"type": "object"},
              "description": "custom tools (a name and an input_schema) go into the prompt; server tools and "
                             "Anthropic-defined ones are left out (named in the x-runner-ignored-tools header)"},
    "tool_choice": _open({"type": {"type": "string", "enum": ["auto", "any", "tool", "none"]}, "name": STRING,
                            "disable_parallel_tool_use": BOOLEAN}, ["type"]),
    "thinking": _open({"type": {"type": "string", "enum": ["enabled", "adaptive", "disabled"]},
                         "budget_tokens": INTEGER}, ["type"]),
    "metadata": {"type": "object"},
}, ["model", "messages", "max_tokens"])
MESSAGES_COUNT_BODY = {**MESSAGES_BODY, "required": ["model", "messages"]}
CONTENT_BLOCK = _open({"type": {"type": "string", "enum": ["text", "tool_use", "thinking"]}}, ["type"])
MESSAGE = _open({
    "id": STRING, "type": {"type": "string", "enum": ["message"]}, "role": {"type": "string", "enum": ["assistant"]},
    "content": {"type": "array", "items": CONTENT_BLOCK}, "model": STRING,
    "stop_reason": nullable({"type": "string", "enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use",
                                                          "model_context_window_exceeded"]}),
    "stop_sequence": nullable(STRING), "stop_details": nullable({"type": "object"}),
    "container": nullable({"type": "object"}),
    "usage": _open({"input_tokens": INTEGER, "output_tokens": INTEGER,
                      "cache_creation_input_tokens": nullable(INTEGER), "cache_read_input_tokens": nullable(INTEGER),
                      "cache_creation": nullable({"type": "object"}), "server_tool_use": nullable({"type": "object"}),
                      "service_tier": nullable(STRING)},
                     ["input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
                      "cache_creation", "server_tool_use", "service_tier"]),
}, ["id", "type", "role", "content", "model", "stop_reason", "stop_sequence", "stop_details", "container", "usage"])
ANTHROPIC_ERROR = _open({"type": {"type": "string", "enum": ["error"]},
                           "error": _open({"type": STRING, "message": STRING}, ["type", "message"])},
                          ["type", "error"])
ANTHROPIC_ERRORS = {"400": "bad input", "401": "missing or wrong API key", "404": "unknown model",
                    "413": "body over --max-body-mb", "415": "not application/json",
                    "503": "queue full or engine stopped"}


def paths(api_errors: dict[str, Any], event_stream: dict[str, Any], model_ids: list[str] | None,
          needs_key: bool) -> dict[str, Any]:
    """The three paths; `api_errors`: OpenAI's documented error replies; `event_stream`: the
    text/event-stream content entry every streamed reply has."""
    def body(schema: dict[str, Any]) -> dict[str, Any]:
        if model_ids:
            schema = {**schema, "properties": {**schema["properties"], "model": {**schema["properties"]["model"],
                                                                                 "enum": list(model_ids)}}}
        return {"required": True, "content": {"application/json": {"schema": schema}}}

    def ok(schema: dict[str, Any], streams: bool) -> dict[str, Any]:
        content = {"application/json": {"schema": schema}, **(event_stream if streams else {})}
        return {"200": {"description": "the reply", "content": content}}

    anthropic_errors = {status: {"description": why, "content": {"application/json": {"schema": ANTHROPIC_ERROR}}}
                        for status, why in ANTHROPIC_ERRORS.items() if status != "401" or needs_key}
    # the Host and Origin checks answer before any route, in the dialect's envelope
    anthropic_errors["403"] = {**api_errors["403"], "content": {"application/json": {"schema": ANTHROPIC_ERROR}}}
    return {
        "/v1/responses": {"post": {"operationId": "createResponse", "requestBody": body(RESPONSES_BODY),
                                   "responses": {**ok(RESPONSE, True), **api_errors}}},
        "/v1/messages": {"post": {"operationId": "createMessage", "requestBody": body(MESSAGES_BODY),
                                  "responses": {**ok(MESSAGE, True), **anthropic_errors}}},
        "/v1/messages/count_tokens": {"post": {
            "operationId": "countMessageTokens", "requestBody": body(MESSAGES_COUNT_BODY),
            "responses": {**ok(_open({"input_tokens": INTEGER}, ["input_tokens"]), False), **anthropic_errors}}},
    }
