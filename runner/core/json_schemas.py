"""JSON schemas read as llama.cpp's server (and so Ollama) reads them: an object schema that lists its
properties takes no others unless it says so (`additionalProperties` defaults to false there).

Apps written against those servers send schemas without it (pydantic's `model_json_schema()`,
Ollama's tools from Python functions); read by the JSON Schema rule instead, a small model adds keys
without end and the reply never closes. The reply grammar (sampling/constraints.py) and the tool-call
grammar (prompt/tools.py) both read schemas through closed_objects.
"""

from __future__ import annotations

from typing import Any

_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMAS = ("items", "additionalItems", "additionalProperties", "unevaluatedItems", "unevaluatedProperties",
            "contains", "propertyNames", "not", "if", "then", "else")
_SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")


def closed_objects(schema: Any, closable: bool = True) -> Any:
    """The schema with `"additionalProperties": false` on every object schema that lists properties
    and says nothing of others; not where allOf composes objects (each part would refuse the
    others' properties)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed_objects(sub) for name, sub in out[key].items()}
    for key in _SCHEMAS:
        if key in out:
            out[key] = [closed_objects(s) for s in out[key]] if isinstance(out[key], list) else closed_objects(out[key])
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed_objects(s) for s in out[key]]
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [closed_objects(s, closable=False) for s in out["allOf"]]
    if closable and "allOf" not in out and isinstance(out.get("properties"), dict) and \
            not any(key in out for key in _OPEN_KEYS):
        out["additionalProperties"] = False
    return out
