"""Schemas closed as llama.cpp's server closes them (a reply's and a tool call's grammar read them so)."""

from __future__ import annotations

from runner.core.json_schemas import closed_objects


def test_objects_that_list_properties_take_no_others_unless_they_say_so() -> None:
    schema = {"type": "object", "properties": {
        "pet": {"type": "object", "properties": {"name": {"type": "string"}}},
        "properties": {"type": "object", "properties": {"x": {}}},  # (a property named like the keyword)
        "tags": {"type": "array", "items": {"type": "object", "properties": {"t": {}}}},
        "any": {"type": "object"},  # (lists none: any object)
        "open": {"type": "object", "properties": {"a": {}}, "additionalProperties": True},
        "pattern": {"type": "object", "properties": {"a": {}}, "patternProperties": {"^x": {}}}},
        "$defs": {"D": {"anyOf": [{"type": "object", "properties": {"d": {}}}, {"type": "null"}]}}}
    closed = closed_objects(schema)
    props = closed["properties"]
    assert closed["additionalProperties"] is False and set(props) == set(schema["properties"])
    assert props["pet"]["additionalProperties"] is False and props["properties"]["additionalProperties"] is False
    assert props["tags"]["items"]["additionalProperties"] is False
    assert "additionalProperties" not in props["any"] and props["open"]["additionalProperties"] is True
    assert "additionalProperties" not in props["pattern"]
    assert closed["$defs"]["D"]["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # (the caller's schema is left as it was)


def test_objects_that_allof_composes_stay_open() -> None:
    schema = {"allOf": [{"type": "object", "properties": {"a": {}}}, {"type": "object", "properties": {"b": {}}}],
              "properties": {"a": {}, "b": {}}}
    closed = closed_objects(schema)
    assert "additionalProperties" not in closed
    assert all("additionalProperties" not in part for part in closed["allOf"])
