"""The two builders every part of /openapi.json writes its schemas with (OpenAPI 3.0)."""

from __future__ import annotations

from typing import Any


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "nullable": True}


def object_schema(properties: dict[str, Any], required: list[str], extra: bool = False) -> dict[str, Any]:
    """An object with these properties; `extra`: others may appear too."""
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": extra}
