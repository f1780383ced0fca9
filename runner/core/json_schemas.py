"""JSON schemas read as llama.cpp's server (and so Ollama) reads them: an object schema that lists its
properties takes no others unless it says so (`additionalProperties` defaults to false there).

Apps written against those servers send schemas without it (pydantic's `model_json_schema()`,
Ollama's tools from Python functions); read by the JSON Schema rule instead, a small model adds keys
without end and the reply never closes. The reply grammar (sampling/constraints.py) and the tool-call
grammar (prompt/tools.py) both read schemas through closed_objects.

An object is closed only where it alone says what its value's properties are: a schema composed
with others (allOf, anyOf or oneOf beside its properties, a $ref beside them, the target of a $ref
so composed) would refuse the properties the others bring, and the whole schema would be
unsatisfiable (llguidance: "required property 'x' is unsatisfiable").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
# keywords whose schemas describe other values (a property's, an item's) or none (definitions)
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMAS = ("items", "additionalItems", "additionalProperties", "unevaluatedItems", "unevaluatedProperties",
            "contains", "propertyNames", "not", "if", "then", "else")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_DEFINITIONS = ("$defs", "definitions")
# keywords whose schemas apply to the same value as the schema holding them: they compose with it
_IN_PLACE = ("$ref", "allOf", "anyOf", "oneOf", "if", "then", "else", "dependentSchemas")
# an object schema's own words on its properties (beside the properties themselves)
_OWN_KEYS = ("properties", "required", "dependentRequired", "propertyNames", "minProperties", "maxProperties",
             *_OPEN_KEYS)


def map_subschemas(schema: dict[str, Any], visit: Callable[[str, str, Any], Any]) -> dict[str, Any]:
    """A copy of schema with each subschema it holds directly replaced by visit(keyword, pointer,
    subschema): the keyword holding it and its JSON pointer below schema (`/properties/a`, `/anyOf/0`).
    Data values (const, enum, default, examples) are not schemas: they are left as they are."""
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: visit(key, f"/{key}/{_escaped(name)}", sub) for name, sub in out[key].items()}
    for key in _SCHEMAS:
        if isinstance(out.get(key), list):  # (items as a list: draft 4's tuples)
            out[key] = [visit(key, f"/{key}/{i}", sub) for i, sub in enumerate(out[key])]
        elif key in out:
            out[key] = visit(key, f"/{key}", out[key])
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [visit(key, f"/{key}/{i}", sub) for i, sub in enumerate(out[key])]
    return out


def closed_objects(schema: Any) -> Any:
    """The schema with `"additionalProperties": false` on every object schema that lists properties,
    says nothing of others, requires none it does not list, and alone describes its value."""
    if not isinstance(schema, dict):
        return schema
    composed: set[str] = set()  # pointers of the schemas a $ref composes with others
    while True:  # (a composed schema's own references compose theirs: until no new one is found)
        found: set[str] = set()
        out = _closed(schema, "", True, composed, found)
        if found <= composed:
            return out
        composed |= found


def _closed(node: Any, pointer: str, alone: bool, composed: set[str], found: set[str]) -> Any:
    """closed_objects below `pointer`; alone: nothing else applies to this schema's value. Adds to
    `found` the targets of the local references that are not alone."""
    if not isinstance(node, dict):
        return node
    alone = alone and pointer not in composed
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#") and not (alone and _is_sole_part(node, "$ref")):
        found.add(unquote(ref[1:]))

    def visit(keyword: str, below: str, sub: Any) -> Any:
        if keyword in _DEFINITIONS:  # (no value of their own: a reference decides)
            return _closed(sub, pointer + below, True, composed, found)
        part_alone = alone and (keyword not in _IN_PLACE or _is_sole_part(node, keyword))
        return _closed(sub, pointer + below, part_alone, composed, found)

    out = map_subschemas(node, visit)
    if alone and _is_closable(node):
        out["additionalProperties"] = False
    return out


def _is_closable(node: dict[str, Any]) -> bool:
    """Lists its properties, says nothing of others, requires only those, and nothing composed
    with it may bring another."""
    listed = node.get("properties")
    if not isinstance(listed, dict) or any(key in node for key in _OPEN_KEYS):
        return False
    if not _names(node.get("required")) <= set(listed):
        return False
    return "$ref" not in node and not any(_may_add_properties(part, set(listed)) for part in _in_place_parts(node))


def _is_sole_part(node: dict[str, Any], keyword: str) -> bool:
    """Whether keyword's schemas (a $ref's target, one allOf part, anyOf's or oneOf's branches) are
    all that speaks of the value's properties at node: then they are read as if they stood alone."""
    if keyword not in ("$ref", "allOf", "anyOf", "oneOf") or (keyword == "allOf" and len(node["allOf"]) != 1):
        return False
    return not any(key in node for key in _OWN_KEYS) and not any(key in node for key in _IN_PLACE if key != keyword)


def _in_place_parts(node: dict[str, Any]) -> list[Any]:
    parts = [node[key] for key in ("if", "then", "else") if key in node]
    for key in ("allOf", "anyOf", "oneOf"):
        parts += node[key] if isinstance(node.get(key), list) else []
    if isinstance(node.get("dependentSchemas"), dict):
        parts += list(node["dependentSchemas"].values())
    return parts


def _may_add_properties(part: Any, listed: set[str]) -> bool:
    """Whether a schema composed with an object's could let in a property the object does not list:
    any that speaks of properties may, save one that only requires listed ones ("one of these")."""
    if not isinstance(part, dict):
        return False
    return any(key in part for key in (*_OWN_KEYS, *_IN_PLACE) if key != "required") or \
        not _names(part.get("required")) <= listed


def _names(value: Any) -> set[str]:
    return {name for name in value if isinstance(name, str)} if isinstance(value, list) else set()


def _escaped(name: str) -> str:
    """A name as a JSON pointer's token (RFC 6901)."""
    return name.replace("~", "~0").replace("/", "~1")
