"""GET /openapi.json: the API as this server speaks it, built from the parser's own declarations
(Field) so the document cannot drift from what is accepted; the fuzz test holds every
response to it."""

from __future__ import annotations

from typing import Any

from runner import __version__
from runner.prompt.chat_template import ROLES
from runner.server import openai_params, openapi_dialects, openapi_ollama
from runner.server.openapi_schema import nullable, object_schema
from runner.server.request_fields import Field

ERROR_STATUSES = {"400": "bad input", "401": "missing or wrong API key", "403": "Host or Origin not allowed",
                  "404": "unknown model", "413": "body over --max-body-mb", "415": "not application/json",
                  "503": "queue full or engine stopped"}
FINISH_REASONS = ["stop", "length", "cancelled", "error"]




TEXT_PART = object_schema({"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}}, ["type", "text"])
MESSAGE = object_schema({
    "role": {"type": "string", "enum": list(ROLES)},
    "content": nullable({"oneOf": [{"type": "string"}, {"type": "array", "items": TEXT_PART}]}),
    "name": {"type": "string"},
}, ["role"], extra=True)
STOP = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"},
                                       "maxItems": openai_params.MAX_STOP_STRINGS}]}
STREAM_OPTIONS = object_schema({"include_usage": openai_params.INCLUDE_USAGE.schema()}, [], extra=True)
TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
PROMPT = {"oneOf": [{"type": "string"}, TOKEN_IDS,
                    {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": openai_params.MAX_PROMPTS},
                    {"type": "array", "items": TOKEN_IDS, "minItems": 1, "maxItems": openai_params.MAX_PROMPTS}]}
TOOLS = {"type": "array", "items": object_schema({
    "type": {"type": "string", "enum": ["function"]},
    "function": object_schema({"name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                         "description": {"type": "string"}, "parameters": {"type": "object"}}, ["name"], extra=True)},
    ["type", "function"])}
TOOL_CHOICE = {"oneOf": [{"type": "string", "enum": ["auto", "none", "required"]},
                         object_schema({"type": {"type": "string", "enum": ["function"]},
                                  "function": object_schema({"name": {"type": "string"}}, ["name"])}, ["type", "function"])]}
USAGE = object_schema({
    "prompt_tokens": {"type": "integer"}, "completion_tokens": {"type": "integer"},
    "total_tokens": {"type": "integer"},
    "prompt_tokens_details": object_schema({"cached_tokens": {"type": "integer"}}, ["cached_tokens"], extra=True),
}, ["prompt_tokens", "completion_tokens", "total_tokens"], extra=True)
ERROR = object_schema({"error": object_schema({
    "message": {"type": "string"}, "type": {"type": "string"},
    "param": nullable({"type": "string"}), "code": nullable({"type": "string"}),
}, ["message", "type", "param", "code"])}, ["error"])
CHAT_COMPLETION = object_schema({
    "id": {"type": "string"}, "object": {"type": "string", "enum": ["chat.completion"]},
    "created": {"type": "integer"}, "model": {"type": "string"},
    "choices": {"type": "array", "minItems": 1, "items": object_schema({
        "index": {"type": "integer"},
        "message": object_schema({"role": {"type": "string", "enum": ["assistant"]},
                            "content": nullable({"type": "string"}), "refusal": nullable({"type": "string"}),
                            "tool_calls": {"type": "array", "items": object_schema({
                                "id": {"type": "string"}, "type": {"type": "string", "enum": ["function"]},
                                "function": object_schema({"name": {"type": "string"}, "arguments": {"type": "string"}},
                                                    ["name", "arguments"])}, ["id", "type", "function"])}},
                           ["role", "content", "refusal"], extra=True),
        "logprobs": nullable({"type": "object"}),
        "finish_reason": {"type": "string", "enum": [*FINISH_REASONS, "tool_calls"]},
    }, ["index", "message", "finish_reason"], extra=True)},
    "usage": USAGE,
}, ["id", "object", "created", "model", "choices", "usage"], extra=True)
COMPLETION = object_schema({
    "id": {"type": "string"}, "object": {"type": "string", "enum": ["text_completion"]},
    "created": {"type": "integer"}, "model": {"type": "string"},
    "choices": {"type": "array", "minItems": 1, "items": object_schema({
        "index": {"type": "integer"}, "text": {"type": "string"},
        "logprobs": nullable({"type": "object"}),
        "finish_reason": {"type": "string", "enum": FINISH_REASONS},
    }, ["index", "text", "finish_reason"], extra=True)},
    "usage": USAGE,
}, ["id", "object", "created", "model", "choices", "usage"], extra=True)
MODELS = object_schema({"object": {"type": "string", "enum": ["list"]}, "data": {"type": "array", "items": object_schema({
    "id": {"type": "string"}, "object": {"type": "string", "enum": ["model"]}, "created": {"type": "integer"},
    "owned_by": {"type": "string"},
    "placement": object_schema({"n_gpu_layers": {"type": "integer"}, "layers": {"type": "integer"},
                                "gpu_bytes": {"type": "integer"}, "devices": {"type": "array", "items": {"type": "string"}},
                                "auto": {"type": "boolean"}}, []),
    "inputs": {"type": "array", "items": {"type": "string", "enum": ["text", "image", "audio"]}}},
    ["id", "object", "created", "owned_by"], extra=True)}},
    ["object", "data"])


def _request_body(fields: tuple[Field, ...], extra: dict[str, Any], required: list[str]) -> dict[str, Any]:
    properties = {f.name: f.schema() for f in fields} | extra
    # other properties are ignored, except OpenAI's that this server does not do (openai_params.NOT_SUPPORTED):
    # those get 400 unless their value asks for nothing
    return {"required": True, "content": {"application/json": {"schema": object_schema(properties, required, extra=True)}}}


# each server-sent event: data is a JSON chunk (or [DONE]); a failure mid-stream is an error envelope
EVENT_STREAM = {"text/event-stream": {"schema": object_schema({"data": {"type": "string"}, "event": {"type": "string"}},
                                                        ["data"], extra=True)}}


def _errors(statuses: list[str]) -> dict[str, Any]:
    return {s: {"description": ERROR_STATUSES[s], "content": {"application/json": {"schema": ERROR}}} for s in statuses}


def _responses(ok: dict[str, Any], streams: bool, errors: list[str]) -> dict[str, Any]:
    content = {"application/json": {"schema": ok}, **(EVENT_STREAM if streams else {})}
    return {"200": {"description": "the reply", "content": content}, **_errors(errors)}


def openapi_document(needs_key: bool, max_n: int = 1, model_ids: list[str] | None = None) -> dict[str, Any]:
    """The document; `max_n`: the server's slot count, the most choices (n, best_of) one request gets;
    `model_ids`: the names `model` may take."""
    api_errors = [s for s in ERROR_STATUSES if s != "401" or needs_key]
    get_errors = ["403"] + (["401"] if needs_key else [])
    chat_extra = {"messages": {"type": "array", "items": MESSAGE, "minItems": 1}, "stop": STOP,
                  "stream_options": STREAM_OPTIONS, "logit_bias": openai_params.LOGIT_BIAS_SCHEMA,
                  "response_format": openai_params.RESPONSE_FORMAT_SCHEMA, "grammar": openai_params.GRAMMAR_FIELD.schema(),
                  "tools": TOOLS, "tool_choice": TOOL_CHOICE, "parallel_tool_calls": {"type": "boolean"}}
    completion_extra = {"prompt": PROMPT, "stop": STOP, "stream_options": STREAM_OPTIONS,
                        "logit_bias": openai_params.LOGIT_BIAS_SCHEMA, "response_format": openai_params.RESPONSE_FORMAT_SCHEMA,
                        "grammar": openai_params.GRAMMAR_FIELD.schema()}
    doc: dict[str, Any] = {
        "openapi": "3.0.3",
        "info": {"title": "runner", "version": __version__,
                 "description": "OpenAI-, Anthropic- and Ollama-compatible API of a local runner server"},
        "paths": {
            "/v1/chat/completions": {"post": {
                "operationId": "createChatCompletion",
                "requestBody": _request_body(openai_params.CHAT_FIELDS, chat_extra, ["model", "messages"]),
                "responses": _responses(CHAT_COMPLETION, True, api_errors)}},
            "/v1/completions": {"post": {
                "operationId": "createCompletion",
                "requestBody": _request_body(openai_params.COMPLETION_FIELDS, completion_extra, ["model", "prompt"]),
                "responses": _responses(COMPLETION, True, api_errors)}},
            "/v1/models": {"get": {"operationId": "listModels", "responses": _responses(MODELS, False, get_errors)}},
            "/health": {"get": {"operationId": "health", "responses": {
                "200": {"description": "serving", "content": {"application/json": {"schema": {"type": "object"}}}},
                "403": {"description": ERROR_STATUSES["403"], "content": {"application/json": {"schema": ERROR}}},
                "503": {"description": "the engine has stopped",
                        "content": {"application/json": {"schema": {"type": "object"}}}}}}},
        },
    }
    doc["paths"].update(openapi_dialects.paths(_errors(api_errors), EVENT_STREAM, model_ids, needs_key))
    doc["paths"].update(openapi_ollama.paths(_errors(["403"])["403"], needs_key, model_ids))
    for path in ("/v1/chat/completions", "/v1/completions"):
        properties = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]
        for name in ("n", "best_of"):
            if name in properties:
                properties[name] = {**properties[name], "maximum": max_n}
        if model_ids:
            properties["model"] = {**properties["model"], "enum": list(model_ids)}
    if needs_key:
        doc["components"] = {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}}
        doc["security"] = [{"bearer": []}]
    return doc
