"""Function calling: templates that know tools, the three native call syntaxes and the fallback,
constrained calls on the tiny model, and reading calls back."""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema
import pytest

from engines import load_tiny, submit_all
from runner.prompt.chat_template import ChatTemplate, Message
from runner.sampling.constraints import JSON_LAYOUT, GrammarSpec
from runner.model.loaded_model import LoadedModel
from runner.sampling.params import SamplingParams
from runner.scheduler.request import GenerationRequest
from runner.prompt.tools import (HERMES, LLAMA3, MISTRAL, ShownText, Tool, ToolCall, call_grammar, parse_calls,
                                 syntax_of)
from tiny_gguf import write_tiny_gguf

WEATHER = Tool("get_weather", "The weather in a city",
               {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                 "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                "required": ["city", "days"], "additionalProperties": False})
DIGIT = {"type": "integer", "minimum": 0, "maximum": 9}
ADD = Tool("add", "a + b", {"type": "object", "properties": {"a": DIGIT, "b": DIGIT}, "required": ["a", "b"],
                            "additionalProperties": False})
# minimal templates in each family's style: the marker that tells the syntax, and the tools rendered
TEMPLATES = {
    HERMES: ("{% if tools %}<|im_start|>system\n<tools>{{ tools | tojson }}</tools> Call with <tool_call>"
             "<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
             "{% endfor %}<|im_start|>assistant\n"),
    LLAMA3: ("{% if tools %}Environment: ipython\n{{ tools | tojson }}\n{% endif %}{% for m in messages %}"
             "{{ m.role }}: {{ m.content }}\n{% endfor %}assistant: "),
    MISTRAL: ("{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
              "{% for m in messages %}[INST]{{ m.content }}[/INST]{% endfor %} [TOOL_CALLS] maybe"),
}


def test_each_family_is_told_by_its_template() -> None:
    assert [syntax_of(TEMPLATES[s]) for s in (HERMES, LLAMA3, MISTRAL)] == [HERMES, LLAMA3, MISTRAL]
    assert syntax_of(None) == HERMES


@pytest.mark.parametrize(("syntax", "text", "want"), [
    (HERMES, 'Sure.<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
     ("Sure.", [("add", {"a": 1, "b": 2})])),
    (HERMES, '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call><tool_call>{"name": '
             '"get_weather", "arguments": {"city": "Oslo", "days": 2}}</tool_call>',
     ("", [("add", {"a": 1, "b": 2}), ("get_weather", {"city": "Oslo", "days": 2})])),
    (LLAMA3, '<|python_tag|>{"name": "add", "parameters": {"a": 5, "b": 6}}', ("", [("add", {"a": 5, "b": 6})])),
    (MISTRAL, '[TOOL_CALLS][{"name": "add", "arguments": {"a": 0, "b": 1}}]', ("", [("add", {"a": 0, "b": 1})])),
    (HERMES, "Just text, no call.", ("Just text, no call.", [])),
    (HERMES, '<tool_call>{"name": "delete_everything", "arguments": {}}</tool_call>', None),  # not offered
    (LLAMA3, '{"name": "add", "parameters": {"a": 1', None),  # cut off
    # cut inside a call (max_tokens): its markup is not content (it leaked beside the calls read)
    (HERMES, '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call><tool_call>{"name": "get_w',
     ("", [("add", {"a": 1, "b": 2})])),
    (HERMES, 'Let me look.\n<tool_call>{"name": "get_weather", "argu', ("Let me look.\n", [])),
    (HERMES, "Let me look. <tool_", ("Let me look. ", [])),  # (cut inside the tag: "<tool_" leaked)
    (HERMES, "\n  Hi", ("Hi", [])),  # (as with calls: a reply's text starts where its words do)
    (HERMES, "A <tool_call>x</tool_call> B <tool", ("A <tool_call>x</tool_call> B ", [])),  # (cut after a block)
])
def test_calls_are_read_back_from_each_syntax(syntax: str, text: str, want) -> None:
    content, calls = parse_calls(syntax, text, [WEATHER, ADD])
    if want is None:
        assert (content, calls) == (text, [])
        return
    assert content == want[0]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == want[1]
    assert all(c.id.startswith("call_") for c in calls) and len({c.id for c in calls}) == len(calls)


def test_a_template_that_knows_tools_renders_them_and_one_that_does_not_gets_a_system_message() -> None:
    knows = ChatTemplate(TEMPLATES[HERMES])
    assert '"name": "get_weather"' in knows.render([Message("user", "hi")], tools=[WEATHER])
    plain = ChatTemplate("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
    text = plain.render([Message("user", "hi")], tools=[WEATHER])
    assert text.startswith("system: You can call these functions.") and '"name": "get_weather"' in text


def test_a_template_that_knows_no_tools_still_shows_earlier_calls_and_their_results() -> None:
    """It rendered an assistant's calls as an empty turn: over a tool loop the model (SmolLM2, the
    default) never saw what it had called."""
    plain = ChatTemplate("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
    called = Message("assistant", "", (ToolCall("call_1", "add", '{"a": 4, "b": 5}'),))
    text = plain.render([Message("user", "4+5?"), called, Message("tool", "9", tool_call_id="call_1")],
                        add_generation_prompt=False, tools=[ADD])
    assert text.endswith('user: 4+5?\nassistant: <tool_call>{"name": "add", "arguments": {"a": 4, "b": 5}}'
                         "</tool_call>\ntool: <tool_response>9</tool_response>\n")
    assert "<tool_call>" in text


def test_an_earlier_call_and_its_result_reach_the_template() -> None:
    template = ChatTemplate("{% for m in messages %}{{ m.role }}|{{ m.content }}|"
                            "{% for c in m.tool_calls or [] %}{{ c.function.name }}({{ c.function.arguments.a }})"
                            "{% endfor %}{{ m.tool_call_id or '' }}\n{% endfor %}")
    text = template.render([Message("assistant", "", (ToolCall("call_1", "add", '{"a": 4, "b": 5}'),)),
                            Message("tool", "9", tool_call_id="call_1")])
    assert text == "assistant||add(4)\ntool|9|call_1\n"  # arguments as an object, as templates expect


@pytest.fixture(scope="module", params=[HERMES, LLAMA3, MISTRAL])
def family(request, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, LoadedModel]]:
    path = write_tiny_gguf(tmp_path_factory.mktemp(request.param) / "m.gguf", chat_template=TEMPLATES[request.param])
    loaded = load_tiny(path, 2, ctx_size=1024)  # the tools' schemas make long prompts for a byte-level vocabulary
    yield request.param, loaded
    loaded.close()


@pytest.mark.parametrize("parallel", [False, True])
def test_a_required_call_is_emitted_in_the_familys_syntax_and_read_back(family: tuple[str, LoadedModel],
                                                                        parallel: bool) -> None:
    syntax, loaded = family
    assert syntax_of(loaded.template.source) == syntax and loaded.template.knows_tools
    prompt = loaded.chat_prompt_ids([Message("user", "weather in Oslo?")], [WEATHER, ADD])
    requests = [GenerationRequest(f"t{seed}", prompt, SamplingParams(temperature=1.0, seed=seed), 200,
                                  constraint=loaded.compile_constraint(GrammarSpec(
                                      "lark", call_grammar(syntax, [WEATHER, ADD], parallel, JSON_LAYOUT), "tools")))
                for seed in range(3)]
    finished = [events for events in submit_all(loaded.engine, requests) if events[-1].finish_reason.value == "stop"]
    assert finished  # (the others ran out of tokens mid-call: nothing to read)
    for events in finished:
        text = "".join(e.text for e in events)
        content, calls = parse_calls(syntax, text, [WEATHER, ADD])
        assert calls and content == "", text
        assert parallel or len(calls) == 1
        for call in calls:
            jsonschema.validate(json.loads(call.arguments), (WEATHER if call.name == WEATHER.name else ADD).parameters)


def test_a_tool_schema_keyword_the_grammar_cannot_enforce_is_left_unenforced_not_refused(
        family: tuple[str, LoadedModel]) -> None:
    """Claude Code's TaskCreate tool: `propertyNames` (llguidance does not implement it) beside
    what it does enforce: the call still compiles, and its required field is still required."""
    syntax, loaded = family
    task = Tool("TaskCreate", "a task", {"type": "object", "properties": {
        "subject": {"type": "string", "maxLength": 6},
        "metadata": {"type": "object", "propertyNames": {"type": "string"}, "additionalProperties": {}}},
        "required": ["subject"], "additionalProperties": False})
    prompt = loaded.chat_prompt_ids([Message("user", "make a task")], [task])
    requests = [GenerationRequest(f"p{seed}", prompt, SamplingParams(temperature=1.0, seed=seed), 120,
                                  constraint=loaded.compile_constraint(GrammarSpec(
                                      "lark", call_grammar(syntax, [task], False, JSON_LAYOUT), "tools")))
                for seed in range(2)]
    finished = [events for events in submit_all(loaded.engine, requests) if events[-1].finish_reason.value == "stop"]
    assert finished
    for events in finished:
        _, calls = parse_calls(syntax, "".join(e.text for e in events), [task])
        assert len(calls) == 1 and len(json.loads(calls[0].arguments)["subject"]) <= 6


ITEMS = Tool("add_items", "items to a list", {  # as pydantic writes a model's nested model (the Agents SDK's tools)
    "type": "object", "$defs": {"Item": {"type": "object", "properties": {"name": {"type": "string"}},
                                         "required": ["name"]}},
    "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}}}, "required": ["items"]})


def _call_text(syntax: str, calls: list[tuple[str, dict]]) -> str:
    """Calls in each family's syntax (Hermes: blocks; Mistral: one list)."""
    key = "parameters" if syntax == LLAMA3 else "arguments"
    objects = [json.dumps({"name": name, key: arguments}) for name, arguments in calls]
    if syntax == MISTRAL:
        return "[TOOL_CALLS][" + ", ".join(objects) + "]"
    if syntax == LLAMA3:
        return objects[0]
    return "".join(f"<tool_call>{o}</tool_call>" for o in objects)


def _n_valid(loaded: LoadedModel, grammar: str, text: str) -> tuple[int, int]:
    ids = loaded.model.tokenize(text, add_special=False, parse_special=False)
    return loaded.compile_constraint(GrammarSpec("lark", grammar, "tools")).n_valid(ids), len(ids)


def test_a_tool_schema_with_definitions_compiles_and_is_enforced(family: tuple[str, LoadedModel]) -> None:
    """Its #/$defs/... references pointed at the call's root, where nothing was: a 400 in every mode."""
    syntax, loaded = family
    grammar = call_grammar(syntax, [WEATHER, ITEMS], syntax != LLAMA3, JSON_LAYOUT)
    n_valid, n = _n_valid(loaded, grammar, _call_text(syntax, [("add_items", {"items": [{"name": "apple"}]})]))
    assert n_valid == n
    n_valid, n = _n_valid(loaded, grammar, _call_text(syntax, [("add_items", {"items": [{"nom": "apple"}]})]))
    assert n_valid < n  # the definition is enforced, not dropped



PET = {"type": "object", "properties": {"name": {"type": "string"}, "legs": {"type": "integer"}},
       "required": ["name", "legs"]}


@pytest.mark.parametrize(("reply", "is_valid"), [
    ("call", True), ('{"name": "Rex", "legs": 4}', True), ('{"name": "Rex"}', False), ("Rex has four legs.", False),
])
def test_beside_a_json_reply_format_a_reply_is_calls_or_that_json(family: tuple[str, LoadedModel], reply: str,
                                                                   is_valid: bool) -> None:
    """(a reply format beside tools was refused: the Agents SDK's agents with tools and an output_type
    failed every run)"""
    syntax, loaded = family
    grammar = call_grammar(syntax, [WEATHER, ADD], syntax != LLAMA3, JSON_LAYOUT, reply_schema=PET)
    text = _call_text(syntax, [("add", {"a": 1, "b": 2})]) if reply == "call" else reply
    n_valid, n = _n_valid(loaded, grammar, text)
    assert (n_valid == n) is is_valid


TREE = Tool("plant", "a tree of labelled nodes", {  # recursive: a node's children are nodes ("#")
    "type": "object", "properties": {"label": {"type": "string", "maxLength": 5},
                                     "children": {"type": "array", "items": {"$ref": "#"}}},
    "required": ["label"]})
PAIR = Tool("pair", "two of a kind", {  # one property refers to another; a constant holds a "$ref" key as data
    "type": "object", "properties": {"a": {"enum": [1, 2]}, "b": {"$ref": "#/properties/a"},
                                     "link": {"const": {"$ref": "#/$defs/x"}}},
    "required": ["a", "b", "link"]})


@pytest.mark.parametrize(("call", "is_valid"), [
    (("plant", {"label": "root", "children": [{"label": "leaf", "children": []}]}), True),
    (("plant", {"label": "root", "children": [{"name": "plant", "arguments": {"label": "leaf"}}]}), False),
    (("pair", {"a": 1, "b": 2, "link": {"$ref": "#/$defs/x"}}), True),
    (("pair", {"a": 1, "b": 3, "link": {"$ref": "#/$defs/x"}}), False),
    (("pair", {"a": 1, "b": 2, "link": {"$ref": "#/$defs/tool1/$defs/x"}}), False),
])
def test_a_tools_root_relative_references_keep_meaning_its_parameters(family: tuple[str, LoadedModel],
                                                                      call: tuple[str, dict], is_valid: bool) -> None:
    """"#" pointed at the call (a child had to be a call), "#/properties/a" was a 400 (the call's root
    has no such property), and a constant's "$ref" key was rewritten as if it were a reference."""
    syntax, loaded = family
    grammar = call_grammar(syntax, [TREE, PAIR], syntax != LLAMA3, JSON_LAYOUT)
    n_valid, n = _n_valid(loaded, grammar, _call_text(syntax, [call]))
    assert (n_valid == n) is is_valid


SHOWN_REPLIES = [
    (HERMES, "Sure, let me check.\n\n<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}</tool_call>\nDone.",
     "Sure, let me check."),
    (HERMES, "\n  A poem about the sea, in four lines.\nWaves < rocks; <b>bold</b> <tool", "A poem about the sea, in four lines.\nWaves < rocks; <b>bold</b>"),
    (HERMES, '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>', ""),
    (HERMES, 'Hi <tool_call>{"name": "nope", "arguments": {}}</tool_call> there', "Hi"),
    # a '<' held back, then shown once a whole tag follows it: the whole reply's text keeps it too (it
    # was cut there as a tag's start once the blocks were taken out)
    (HERMES, 'Is 2 <<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>', "Is 2 <"),
    (HERMES, '<t<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>', "<t"),
    (LLAMA3, "The answer is 4.", "The answer is 4."),
    (LLAMA3, ' <|python_tag|>{"name": "add", "parameters": {"a": 5, "b": 6}}', ""),
    (LLAMA3, '{"not": "a call"}', ""),
    (MISTRAL, "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 0, \"b\": 1}}]", ""),
    (MISTRAL, "[Note] four.", "[Note] four."),
]


@pytest.mark.parametrize(("syntax", "reply", "shown_by_the_end"), SHOWN_REPLIES)
@pytest.mark.parametrize("piece", [1, 3, 7, 1000])
def test_the_text_a_reply_with_tools_shows_as_it_streams_starts_its_text(syntax: str, reply: str,
                                                                         shown_by_the_end: str, piece: int) -> None:
    """What streams before the reply ends (in pieces of any size) is text up to where a call may
    begin, and always the start of the text read from the whole reply; no markup shows."""
    shown = ShownText(syntax)
    sent = "".join(shown.push(reply[i:i + piece]) for i in range(0, len(reply), piece))
    assert sent == shown.shown == shown_by_the_end
    content, _ = parse_calls(syntax, reply, [WEATHER, ADD])
    assert content.startswith(sent)
    assert "<tool" not in sent and "TOOL_CALLS" not in sent


def test_plain_text_beside_tools_shows_as_it_comes_not_at_the_end() -> None:
    shown = ShownText(HERMES)
    assert [shown.push(t) for t in ("Once", " upon", " a", " time", " <", "tool")] == ["Once", " upon", " a", " time", "", ""]
