"""Schemas closed as llama.cpp's server closes them (a reply's and a tool call's grammar read them so)."""

from __future__ import annotations

import pytest

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


BASE = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
# schemas that closing made unsatisfiable (llguidance: "required property 'x' is unsatisfiable")
COMPOSED = {
    "anyOf adds required properties": {
        "type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}}, "required": ["kind"],
        "anyOf": [{"properties": {"meow": {"type": "boolean"}}, "required": ["meow"]},
                  {"properties": {"bark": {"type": "boolean"}}, "required": ["bark"]}]},
    "$ref beside properties": {"$defs": {"base": BASE}, "$ref": "#/$defs/base",
                               "properties": {"name": {"type": "string"}}, "required": ["name"]},
    "allOf of a $ref": {"$defs": {"base": BASE}, "allOf": [{"$ref": "#/$defs/base"}],
                        "properties": {"name": {"type": "string"}}, "required": ["name", "id"]},
    "required names an unlisted key": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"]},
}


@pytest.mark.parametrize("case", list(COMPOSED))
def test_objects_that_others_compose_with_or_that_require_unlisted_keys_stay_open(case: str) -> None:
    assert closed_objects(COMPOSED[case]) == COMPOSED[case]


def test_a_definition_closes_where_every_reference_to_it_stands_alone() -> None:
    """pydantic's Optional[Model] (anyOf with null) and v1's described field (allOf of one $ref) stand
    alone; a definition also composed elsewhere, or a node below it, stays open."""
    schema = {"$defs": {"Pet": {"type": "object", "properties": {"n": {}}},
                        "Old": {"type": "object", "properties": {"o": {}}},
                        "Both": {"type": "object", "properties": {"b": {}, "kid": {"$ref": "#/$defs/Kid"}}},
                        "Kid": {"type": "object", "properties": {"k": {}}}},
              "type": "object", "properties": {
                  "pet": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}], "default": None},
                  "old": {"allOf": [{"$ref": "#/$defs/Old"}], "description": "an old one"},
                  "alone": {"$ref": "#/$defs/Both"},
                  "more": {"$ref": "#/$defs/Both", "properties": {"m": {}}},
                  "tree": {"type": "object", "properties": {"v": {}, "kids": {"type": "array",
                                                                              "items": {"$ref": "#/properties/tree"}}}}}}
    closed = closed_objects(schema)
    assert closed["additionalProperties"] is False
    assert [name for name, d in closed["$defs"].items() if "additionalProperties" in d] == ["Pet", "Old"]
    assert "additionalProperties" not in closed["properties"]["more"]
    assert closed["properties"]["tree"]["additionalProperties"] is False


def test_a_composition_that_only_requires_listed_properties_keeps_the_object_closed() -> None:
    one_of_these = {"type": "object", "properties": {"email": {}, "phone": {}},
                    "anyOf": [{"required": ["email"]}, {"required": ["phone"]}]}
    assert closed_objects(one_of_these) == {**one_of_these, "additionalProperties": False}
