"""Grammars compiled by llguidance against the tiny model's vocabulary: masks, advancing, forcing, errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from runner.sampling.constraints import ConstraintError, GrammarSpec, compile_constraint
from runner.runtime.llama import Model


@pytest.fixture(scope="module")
def model(tiny_gguf: Path) -> Iterator[Model]:
    m = Model(tiny_gguf)
    yield m
    m.close()


def compile_(model: Model, kind: str, source: str, param: str = "response_format"):
    return compile_constraint(GrammarSpec(kind, source, param), model.guidance_tokenizer, model.n_vocab)


def text_of(model: Model, ids: list[int]) -> str:
    return b"".join(model.token_bytes(t) for t in ids).decode()


def test_a_json_object_must_start_with_a_brace(model: Model) -> None:
    c = compile_(model, "json_object", "")
    allowed = np.flatnonzero(c.allowed())
    assert len(allowed) > 0 and all(text_of(model, [int(t)]).lstrip().startswith("{") for t in allowed)
    logits = np.zeros(model.n_vocab, dtype=np.float32)
    c.mask_into(logits)
    assert np.isneginf(logits).sum() == model.n_vocab - len(allowed)


def test_a_schema_forces_its_fixed_parts_and_ends_when_done(model: Model) -> None:
    schema = {"type": "object", "properties": {"ok": {"enum": [True]}}, "required": ["ok"],
              "additionalProperties": False}
    c = compile_(model, "json_schema", json.dumps(schema))
    produced: list[int] = []
    while not c.is_done and len(produced) < 50:
        # the grammar's forced tokens, else its first allowed token that is not a blank
        step = c.forced_tokens() or [next(int(t) for t in np.flatnonzero(c.allowed())
                                          if text_of(model, [int(t)]).strip())]
        for t in step:
            c.advance(t)
        produced += step
    assert json.loads(text_of(model, produced)) == {"ok": True}


def test_drafts_are_checked_against_the_grammar(model: Model) -> None:
    c = compile_(model, "gbnf", 'root ::= "yes" | "no"', "grammar")
    yes = model.tokenize("yes", add_special=False, parse_special=False)
    maybe = model.tokenize("maybe", add_special=False, parse_special=False)
    assert c.n_valid(yes) == len(yes) and c.n_valid(maybe) == 0 and c.n_valid([]) == 0


def test_a_token_the_grammar_refuses_is_an_error(model: Model) -> None:
    c = compile_(model, "lark", 'start: "a"', "grammar")
    with pytest.raises(ConstraintError, match="cannot take token"):
        c.advance(model.tokenize("b", add_special=False, parse_special=False)[0])


@pytest.mark.parametrize(("kind", "source", "message"), [
    ("json_schema", json.dumps({"$ref": "#/$defs/missing"}), "does not exist"),
    ("json_schema", "{not json", ""),
    ("lark", "start: foo ::", "Expected"),
    ("gbnf", "root ::= (", ""),
])
def test_what_cannot_compile_is_a_constraint_error_naming_the_parameter(model: Model, kind: str, source: str,
                                                                       message: str) -> None:
    with pytest.raises(ConstraintError, match=rf"^grammar: .*{message}" if kind in ("lark", "gbnf")
                       else rf"^response_format: .*{message}"):
        compile_(model, kind, source, "grammar" if kind in ("lark", "gbnf") else "response_format")


def test_masks_prefetched_together_equal_the_ones_computed_alone(model: Model) -> None:
    from runner.sampling.constraints import prefetch_masks

    specs = [("json_object", ""), ("gbnf", 'root ::= "yes" | "no"'), ("lark", 'start: "a" "b"')]
    alone = [compile_(model, kind, source, "grammar").allowed() for kind, source in specs]
    together = [compile_(model, kind, source, "grammar") for kind, source in specs]
    prefetch_masks(together)
    assert all(c.next_bits is not None for c in together)
    assert all(np.array_equal(c.allowed(), want) for c, want in zip(together, alone))
    first = int(np.flatnonzero(together[2].allowed())[0])
    together[2].advance(first)
    assert together[2].next_bits is None  # a prefetched mask is for one state only


def test_a_lazy_grammar_masks_nothing_until_its_trigger_then_everything(model: Model) -> None:
    from runner.sampling.constraints import LazyConstraint

    make = lambda: compile_(model, "lark", 'start: "<tool_call>" /[a-z]+/ "</tool_call>"', "tools")  # noqa: E731
    lazy = LazyConstraint("<tool_call>", make, model.token_bytes)
    for t in model.tokenize("Sure, ", add_special=False, parse_special=False):
        logits = np.zeros(model.n_vocab, dtype=np.float32)
        lazy.mask_into(logits)
        assert not np.isinf(logits).any() and lazy.n_valid([t, t]) == 2  # text: nothing masked or cut
        lazy.advance(t)
    assert not lazy.is_active
    for t in model.tokenize("<tool_call>", add_special=False, parse_special=False):
        lazy.advance(t)
    assert lazy.is_active  # from here only the call's grammar
    allowed = lazy.current.allowed()
    assert all(text_of(model, [int(t)]).isalpha() for t in np.flatnonzero(allowed))


def test_a_lazy_grammar_whose_trigger_starts_inside_a_token_gives_up(model: Model) -> None:
    from runner.sampling.constraints import LazyConstraint

    make = lambda: compile_(model, "lark", 'start: "he"', "tools")  # noqa: E731
    lazy = LazyConstraint("e", make, model.token_bytes)
    he = model.tokenize("he", add_special=False, parse_special=False)
    assert len(he) == 1  # "he" is one token of the tiny vocabulary: "e" starts inside it
    lazy.advance(he[0])
    assert not lazy.is_active and lazy.n_valid([1, 2]) == 2


@pytest.mark.parametrize(("schema", "instance"), [
    ({"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}}, "required": ["kind"],
      "anyOf": [{"properties": {"meow": {"type": "boolean"}}, "required": ["meow"]},
                {"properties": {"bark": {"type": "boolean"}}, "required": ["bark"]}]},
     {"kind": "cat", "meow": True}),
    ({"$defs": {"base": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}},
      "$ref": "#/$defs/base", "properties": {"name": {"type": "string"}}, "required": ["name"]},
     {"id": 7, "name": "x"}),
    ({"$defs": {"base": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}},
      "allOf": [{"$ref": "#/$defs/base"}], "properties": {"name": {"type": "string"}}, "required": ["name", "id"]},
     {"id": 7, "name": "x"}),  # (llguidance writes the merged properties in order: the $ref's first)
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"]}, {"b": 1}),
])
def test_a_schema_that_composes_objects_compiles_and_takes_its_instances(model: Model, schema: dict,
                                                                         instance: dict) -> None:
    """Closed as if each object stood alone, these were a 400: "required property 'x' is unsatisfiable"."""
    c = compile_(model, "json_schema", json.dumps(schema))
    ids = model.tokenize(json.dumps(instance), add_special=False, parse_special=False)
    assert c.n_valid(ids) == len(ids)


def _optional_integers(n: int) -> str:
    return json.dumps({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)},
                       "required": ["p0", "p1", "p2"]})


def test_an_object_of_a_thousand_optional_properties_is_followed_to_its_end(model: Model) -> None:
    """llguidance's default row limit (2,000 items) failed it at the first optional property's comma."""
    c = compile_(model, "json_schema", _optional_integers(1100))
    for t in model.tokenize('{"p0": 1, "p1": 2, "p2": 3, "p17": 4, "p1099": 5}', add_special=False,
                            parse_special=False):
        c.advance(t)
    assert c.is_done


def test_a_grammar_past_the_parsers_limits_fails_in_one_line(model: Model) -> None:
    """(the error carried kilobytes of the parser's state)"""
    c = compile_(model, "json_schema", _optional_integers(6000))
    ids = model.tokenize('{"p0": 1, "p1": 2, "p2": 3, ', add_special=False, parse_special=False)
    with pytest.raises(ConstraintError) as caught:
        for t in ids:
            c.advance(t)
    assert str(caught.value) == (f"the grammar cannot take token {ids[-2]}: Parser Error: Current row has 11995 items; "
                                 "max is 10000; consider making your grammar left-recursive if it's right-recursive")
