"""The OpenAPI paths of Ollama's API (/api/*): request bodies as server/ollama_api.py reads them,
replies as its builder and server/ollama_models.py write them, errors in Ollama's envelope."""

from __future__ import annotations

from typing import Any

from runner.server import ollama_api, request_fields
from runner.server.openapi_schema import object_schema

STRING, INTEGER, NUMBER, BOOLEAN = ({"type": t} for t in ("string", "integer", "number", "boolean"))


def _open(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return object_schema(properties, required, extra=True)


OPTIONS = _open({**{name: field.schema() for name, field in request_fields.SAMPLING.items()},
                 "seed": INTEGER, "repeat_last_n": {"type": "integer", "minimum": 0},
                 "num_predict": INTEGER, "num_ctx": {"type": "integer", "minimum": 1},
                 "stop": {"type": "array", "items": STRING}}, [])
FORMAT = {"oneOf": [{"type": "string", "enum": ["json"]}, {"type": "object"}]}
THINK = {"oneOf": [BOOLEAN, {"type": "string", "enum": ["low", "medium", "high"]}]}
KEEP_ALIVE = {"oneOf": [STRING, NUMBER], "description": "30s, 5m, 1h; 0: unload after the reply; -1: keep"}
TOOL_CALL = _open({"function": _open({"name": STRING, "arguments": {"type": "object"}}, ["name"])}, ["function"])
MESSAGE = _open({"role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]}, "content": STRING,
                 "tool_calls": {"type": "array", "items": TOOL_CALL}, "tool_name": STRING}, ["role"])
COMMON = {"model": request_fields.MODEL.schema(), "options": OPTIONS, "format": FORMAT,
          "stream": {"type": "boolean", "description": "NDJSON objects as the reply comes (default true)"},
          "keep_alive": KEEP_ALIVE, "think": THINK}
CHAT_BODY = _open({**COMMON, "messages": {"type": "array", "items": MESSAGE},
                   "tools": {"type": "array", "items": _open({"type": STRING, "function": {"type": "object"}},
                                                             ["function"])},
                   "tool_choice": {"oneOf": [{"type": "string", "enum": ["auto", "none", "required"]},
                                             {"type": "object"}],
                                   "description": "an extension: Ollama lets the model decide"}}, ["model"])
GENERATE_BODY = _open({**COMMON, "prompt": STRING, "suffix": STRING, "system": STRING, "raw": BOOLEAN,
                       "template": STRING}, ["model"])
EMBED_BODY = _open({"model": request_fields.MODEL.schema(),
                    "input": {"oneOf": [STRING, {"type": "array", "items": STRING, "minItems": 1}]},
                    "truncate": ollama_api.TRUNCATE.schema(), "dimensions": ollama_api.DIMENSIONS.schema(),
                    "keep_alive": KEEP_ALIVE}, ["model", "input"])
SHOW_BODY = _open({"model": request_fields.MODEL.schema()}, ["model"])
DONE = {"done": BOOLEAN, "done_reason": STRING, "total_duration": INTEGER, "load_duration": INTEGER,
        "prompt_eval_count": INTEGER, "prompt_eval_duration": INTEGER, "eval_count": INTEGER,
        "eval_duration": INTEGER}
CHAT_REPLY = _open({"model": STRING, "created_at": STRING,
                    "message": _open({"role": STRING, "content": STRING, "thinking": STRING,
                                      "tool_calls": {"type": "array", "items": TOOL_CALL}}, ["role", "content"]),
                    **DONE}, ["model", "created_at", "message", "done"])
GENERATE_REPLY = _open({"model": STRING, "created_at": STRING, "response": STRING, "thinking": STRING, **DONE},
                       ["model", "created_at", "response", "done"])
EMBED_REPLY = _open({"model": STRING, "embeddings": {"type": "array", "items": {"type": "array", "items": NUMBER}},
                     "total_duration": INTEGER, "load_duration": INTEGER, "prompt_eval_count": INTEGER},
                    ["embeddings"])
DETAILS = _open({"format": STRING, "family": STRING, "parameter_size": STRING, "quantization_level": STRING}, [])
MODEL = _open({"name": STRING, "model": STRING, "size": INTEGER, "digest": STRING, "details": DETAILS},
              ["name", "model", "size", "digest"])
SHOW_REPLY = _open({"template": STRING, "details": DETAILS, "model_info": {"type": "object"},
                    "capabilities": {"type": "array", "items": STRING}}, ["details", "model_info", "capabilities"])
OLLAMA_ERROR = _open({"error": STRING}, ["error"])
OLLAMA_ERRORS = {"400": "bad input", "401": "missing or wrong API key", "404": "unknown model",
                 "413": "body over --max-body-mb", "503": "queue full or engine stopped"}
NDJSON = {"application/x-ndjson": {"schema": {"type": "string"}}}


def paths(forbidden: dict[str, Any], needs_key: bool, model_ids: list[str] | None) -> dict[str, Any]:
    """Ollama's paths; `forbidden`: the Host/Origin guard's 403, here in Ollama's envelope (guards.refusal)."""
    errors = {status: {"description": why, "content": {"application/json": {"schema": OLLAMA_ERROR}}}
              for status, why in OLLAMA_ERRORS.items() if status != "401" or needs_key}
    forbidden = {**forbidden, "content": {"application/json": {"schema": OLLAMA_ERROR}}}
    errors["403"] = forbidden

    def body(schema: dict[str, Any]) -> dict[str, Any]:
        if model_ids:
            schema = {**schema, "properties": {**schema["properties"],
                                               "model": {**schema["properties"]["model"], "enum": list(model_ids)}}}
        return {"required": True, "content": {"application/json": {"schema": schema}}}

    def ok(schema: dict[str, Any], streams: bool = False) -> dict[str, Any]:
        return {"200": {"description": "the reply",
                        "content": {"application/json": {"schema": schema}, **(NDJSON if streams else {})}}}

    listing = _open({"models": {"type": "array", "items": MODEL}}, ["models"])
    get_errors = {s: e for s, e in errors.items() if s in ("401", "403")}
    return {
        "/api/chat": {"post": {"operationId": "ollamaChat", "requestBody": body(CHAT_BODY),
                               "responses": {**ok(CHAT_REPLY, True), **errors}}},
        "/api/generate": {"post": {"operationId": "ollamaGenerate", "requestBody": body(GENERATE_BODY),
                                   "responses": {**ok(GENERATE_REPLY, True), **errors}}},
        "/api/embed": {"post": {"operationId": "ollamaEmbed", "requestBody": body(EMBED_BODY),
                                "responses": {**ok(EMBED_REPLY), **errors}}},
        "/api/show": {"post": {"operationId": "ollamaShow", "requestBody": body(SHOW_BODY),
                               "responses": {**ok(SHOW_REPLY), **errors}}},
        "/api/tags": {"get": {"operationId": "ollamaTags", "responses": {**ok(listing), **get_errors}}},
        "/api/ps": {"get": {"operationId": "ollamaPs", "responses": {**ok(listing), **get_errors}}},
        "/api/version": {"get": {"operationId": "ollamaVersion", "responses": {
            **ok(_open({"version": STRING}, ["version"])), "403": forbidden}}},
    }
