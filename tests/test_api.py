"""The Python API on the tiny model: replies, and the options apps reach for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.api import Runner
from runner.constraints import ConstraintError


def test_json_schema_and_grammar_reach_the_python_api(tiny_gguf: Path) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    with Runner(tiny_gguf, log=lambda _: None) as r:
        reply = r.chat([{"role": "user", "content": "ok?"}], json_schema=schema, temperature=0, max_tokens=20)
        assert set(json.loads(reply)) == {"ok"}
        assert r.complete("answer:", grammar='root ::= "yes" | "no"', temperature=0.9, max_tokens=5) in ("yes", "no")
        with pytest.raises(ConstraintError, match="grammar"):
            r.complete("x", grammar="root ::= (")
        with pytest.raises(ValueError, match="not both"):
            r.complete("x", grammar="root ::= x", json_schema={})
