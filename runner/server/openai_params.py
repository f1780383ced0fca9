"""OpenAI's Chat Completions, Completions and Embeddings request bodies, parsed and validated into
the internal request types (server/params.py); raw JSON stops here."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from runner.prompt.chat_template import ROLES, Message
from runner.prompt.tools import Tool, ToolCall
from runner.sampling.constraints import JSON_KINDS, GrammarSpec
from runner.sampling.params import SamplingParams
from runner.scheduler.request import BeamParams
from runner.server.errors import invalid
from runner.server.images import ImageParts
from runner.server.params import (
    ChatParams,
    CommonParams,
    CompletionParams,
    EmbeddingParams,
)
from runner.server.request_fields import (
    MAX_TOKENS,
    MODEL,
    SAMPLING,
    STREAM,
    Field,
    checked_tool_choice,
    distinct_tools,
    function_tool,
    is_kind,
    stop_strings,
)

MAX_STOP_STRINGS = 4
MAX_TOP_LOGPROBS = 20
_DEFAULTS = SamplingParams()

N = Field("n", "integer", "choices per request (at most the server's --parallel)", 1)
BEST_OF = Field("best_of", "integer", "generate this many, return the n with the highest mean logprob (not streamed)", 1)
INCLUDE_USAGE = Field("include_usage", "boolean", "a last chunk with the usage")
MAX_COMPLETION_TOKENS = Field("max_completion_tokens", "integer", "most tokens in the reply", 1)
COMPLETION_MAX_TOKENS = Field("max_tokens", "integer", "most tokens in the reply (0, with echo: score the prompt only)", 0)
ECHO = Field("echo", "boolean", "return the prompt before the completion (with logprobs, the prompt's too)")
SUFFIX = Field("suffix", "string", "the text after the completion: fill in the middle (a code model with the tags)")
SEED = Field("seed", "integer", "random seed: same seed, same output", -(2**63), 2**64 - 1)
IGNORE_EOS = Field("ignore_eos", "boolean", "extension: generate max_tokens even past end-of-text")
USE_BEAM_SEARCH = Field("use_beam_search", "boolean", "extension (vLLM's): beam search with n beams, the n best returned")
LENGTH_PENALTY = Field("length_penalty", "number", "beam search: rank by sum of logprobs / length ** this", -10.0, 10.0)
EARLY_STOPPING = Field("early_stopping", "boolean", "beam search: stop once n hypotheses have finished")
CHAT_LOGPROBS = Field("logprobs", "boolean", "return each token's log-probability")
TOP_LOGPROBS = Field("top_logprobs", "integer", "alternatives per token (needs logprobs)", 0, MAX_TOP_LOGPROBS)
COMPLETION_LOGPROBS = Field("logprobs", "integer", "alternatives per token, with log-probabilities", 0, 5)
COMMON_FIELDS = (MODEL, N, STREAM, MAX_COMPLETION_TOKENS, MAX_TOKENS, SEED, IGNORE_EOS, *SAMPLING.values(),
                 USE_BEAM_SEARCH, LENGTH_PENALTY, EARLY_STOPPING)
CHAT_FIELDS = (*COMMON_FIELDS, CHAT_LOGPROBS, TOP_LOGPROBS)
COMPLETION_FIELDS = (*(f for f in COMMON_FIELDS if f is not MAX_TOKENS), COMPLETION_MAX_TOKENS, COMPLETION_LOGPROBS,
                     BEST_OF, ECHO, SUFFIX)
# OpenAI parameters not done here (yet): refused by name instead of silently ignored, unless the
# value asks for nothing (tool_choice "none", an empty logit_bias, response_format text, ...)
NOT_SUPPORTED: dict[str, Callable[[Any], bool]] = {
    "functions": lambda v: v == [], "function_call": lambda v: v == "none",
}


def _refuse_unsupported(body: dict) -> None:
    for name, asks_nothing in NOT_SUPPORTED.items():
        if body.get(name) is not None and not asks_nothing(body[name]):
            raise invalid(f"'{name}' is not supported by this server yet; leave it out", name, "unsupported_parameter")


MAX_LOGIT_BIAS = 100.0
MAX_TOKEN_ID_DIGITS = 9  # above any vocabulary; a longer key would only make int() slow (or refuse past 4300 digits)
LOGIT_BIAS_SCHEMA = {"type": "object", "description": "token id -> bias in [-100, 100] added to its logit",
                     "additionalProperties": {"type": "number", "minimum": -MAX_LOGIT_BIAS, "maximum": MAX_LOGIT_BIAS}}


def _logit_bias(body: dict) -> tuple[tuple[int, float], ...]:
    """{"token id": bias}; ids are checked against the vocabulary where it is known (server/app.py)."""
    value = body.get("logit_bias")
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise invalid("'logit_bias' must be an object of token id -> bias", "logit_bias", "invalid_type")
    out = []
    for key, bias in value.items():
        if not (key.isascii() and key.isdigit() and len(key) <= MAX_TOKEN_ID_DIGITS):
            raise invalid(f"'logit_bias' keys must be token ids, got {json.dumps(key)}", "logit_bias")
        if not is_kind(bias, "number") or not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            raise invalid(f"'logit_bias' values must be numbers in [-100, 100], got {json.dumps(bias)} for {key}",
                          "logit_bias")
        out.append((int(key), float(bias)))
    return tuple(sorted(out))


RESPONSE_FORMAT_SCHEMA = {
    "type": "object", "description": "text (default), json_object (any JSON object; an optional 'schema' as "
                                     "llama.cpp's server takes) or json_schema ({name, schema, strict})",
    "properties": {"type": {"type": "string", "enum": ["text", "json_object", "json_schema"]}},
    "required": ["type"]}
GRAMMAR_FIELD = Field("grammar", "string", "extension: a Lark or GBNF grammar the reply must follow")


def _json_text(value: Any, param: str) -> str:
    if not isinstance(value, dict):
        raise invalid(f"'{param}' must be a JSON schema object", param, "invalid_type")
    return json.dumps(value)


def _grammar(body: dict) -> GrammarSpec | None:
    """response_format, the llama.cpp-style grammar and json_schema fields: at most one of them."""
    given = [k for k in ("response_format", "grammar", "json_schema") if body.get(k) is not None]
    if len(given) > 1:
        raise invalid(f"give one of {', '.join(given)}, not several", given[1])
    if body.get("grammar") is not None:
        return GrammarSpec("gbnf", GRAMMAR_FIELD.read(body), "grammar")  # llguidance tells Lark from GBNF
    if body.get("json_schema") is not None:
        return GrammarSpec("json_schema", _json_text(body["json_schema"], "json_schema"), "json_schema")
    fmt = body.get("response_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise invalid("'response_format' must be {\"type\": \"text\" | \"json_object\" | \"json_schema\"}",
                      "response_format")
    if fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":
        schema = fmt.get("schema")
        return GrammarSpec("json_object" if schema is None else "json_schema",
                           "" if schema is None else _json_text(schema, "response_format"), "response_format")
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise invalid("'response_format.json_schema' must be an object with a 'name' and a 'schema'",
                      "response_format")
    return GrammarSpec("json_schema", _json_text(spec.get("schema", {}), "response_format"), "response_format")


def _common(body: dict, logprobs_key_is_int: bool) -> CommonParams:
    _refuse_unsupported(body)
    model = MODEL.read(body)
    n = N.read(body, 1)
    stream = STREAM.read(body, False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise invalid("'stream_options' must be an object", "stream_options", "invalid_type")
    include_usage = INCLUDE_USAGE.read(options or {}, False)
    max_tokens = MAX_COMPLETION_TOKENS.read(body)
    if max_tokens is None:
        max_tokens = (COMPLETION_MAX_TOKENS if logprobs_key_is_int else MAX_TOKENS).read(body)
    if logprobs_key_is_int:  # /v1/completions: logprobs is the number of alternatives
        n_top = COMPLETION_LOGPROBS.read(body)
    else:
        wants_logprobs = CHAT_LOGPROBS.read(body, False)
        n_top = TOP_LOGPROBS.read(body) if wants_logprobs else None
        if n_top is None and wants_logprobs:
            n_top = 0
        if body.get("top_logprobs") is not None and not wants_logprobs:
            raise invalid("'top_logprobs' requires 'logprobs': true", "top_logprobs")
    seed = SEED.read(body)
    sampling = SamplingParams(**{name: field.read(body, getattr(_DEFAULTS, name)) for name, field in SAMPLING.items()},
                              seed=None if seed is None else seed % 2**64, logit_bias=_logit_bias(body))
    common = CommonParams(model=model, sampling=sampling, max_tokens=max_tokens,
                          stop=stop_strings(body.get("stop"), "stop", MAX_STOP_STRINGS), stream=stream,
                          include_usage=include_usage, n_top_logprobs=n_top, ignore_eos=IGNORE_EOS.read(body, False),
                          grammar=_grammar(body), n=n)
    return dataclasses.replace(common, beam=_beam(body, common))


def _beam(body: dict, common: CommonParams) -> BeamParams | None:
    """use_beam_search (vLLM's convention: n beams, the n best returned), checked against what it excludes."""
    length_penalty, early_stopping = LENGTH_PENALTY.read(body), EARLY_STOPPING.read(body)
    if not USE_BEAM_SEARCH.read(body, False):
        for name, value in (("length_penalty", length_penalty), ("early_stopping", early_stopping)):
            if value is not None:
                raise invalid(f"'{name}' applies to beam search only: add 'use_beam_search': true", name)
        return None
    if common.n < 2:
        raise invalid("beam search needs 'n' of at least 2 (the beam width)", "n")
    if common.stream:
        raise invalid("beam search is not streamed: the best beams are known only at the end", "use_beam_search")
    if common.stop:
        raise invalid("'stop' is not supported with beam search", "stop")
    if common.grammar is not None:
        raise invalid("beam search cannot follow a grammar or response_format here", "use_beam_search")
    if common.sampling.logit_bias:
        raise invalid("'logit_bias' does not apply to beam search (it ranks by the model's own logprobs)",
                      "logit_bias")
    return BeamParams(1.0 if length_penalty is None else length_penalty, bool(early_stopping))


def _content(value: Any, index: int, role: str, images: ImageParts) -> str:
    if value is None and role == "assistant":
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts: text, and images (where each goes: a mark in the text)
        texts = []
        for j, part in enumerate(value):
            where = f"messages[{index}].content[{j}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind == "image_url":
                url = part.get("image_url")
                texts.append(images.add_url(url.get("url") if isinstance(url, dict) else url, where))
            elif kind == "input_audio":
                texts.append(images.add_audio(part.get("input_audio"), where))
            else:
                raise invalid(f"{where}: a content part is text ({{type: text, text}}), an image "
                              "({type: image_url, image_url: {url}}) or audio ({type: input_audio, "
                              "input_audio: {data, format}})", where)
        return "".join(texts)
    raise invalid(f"messages[{index}].content must be a string", f"messages[{index}].content", "invalid_type")


def parse_chat(body: dict[str, Any]) -> ChatParams:
    if body.get("best_of") not in (None, 1):
        raise invalid("'best_of' is a /v1/completions parameter; chat takes 'n'", "best_of", "unsupported_parameter")
    for name in ("echo", "suffix"):
        if body.get(name) not in (None, False, ""):
            raise invalid(f"'{name}' is a /v1/completions parameter", name, "unsupported_parameter")
    messages = body.get("messages")
    if messages is None:
        raise invalid("'messages' is required", "messages", "missing_required_parameter")
    if not isinstance(messages, list):
        raise invalid("'messages' must be a list of messages", "messages", "invalid_type")
    if not messages:
        raise invalid("'messages' must contain at least one message", "messages", "empty_array")
    parsed, images = [], ImageParts()
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise invalid(f"messages[{i}] must be an object", f"messages[{i}]", "invalid_type")
        role = m.get("role")
        if role not in ROLES:
            raise invalid(f"messages[{i}].role must be one of {', '.join(ROLES)}; got {json.dumps(role)}", f"messages[{i}].role")
        content = _content(m.get("content"), i, role, images)
        tool_calls = _message_tool_calls(m.get("tool_calls"), i) if role == "assistant" else ()
        tool_call_id = m.get("tool_call_id")
        if role == "tool" and not isinstance(tool_call_id, str):
            raise invalid(f"messages[{i}]: a tool message needs its 'tool_call_id'", f"messages[{i}].tool_call_id")
        parsed.append(Message("system" if role == "developer" else role, content, tool_calls,
                              tool_call_id if role == "tool" else None))
    common = _common(body, logprobs_key_is_int=False)
    tools = _tools(body.get("tools"))
    choice = _tool_choice(body.get("tool_choice"), tools)
    if tools and choice != "none" and common.grammar is not None and common.grammar.kind not in JSON_KINDS:
        raise invalid(f"give {common.grammar.param} or tools, not both", "tools")  # (a response_format may go with them)
    if tools and choice != "none" and common.beam is not None:
        raise invalid("beam search does not call tools here", "use_beam_search")
    parallel = body.get("parallel_tool_calls")
    parallel = True if parallel is None else parallel  # (null: not given, as every optional field)
    if not isinstance(parallel, bool):
        raise invalid("'parallel_tool_calls' must be a boolean", "parallel_tool_calls", "invalid_type")
    return ChatParams(common=common, messages=parsed, tools=tools, tool_choice=choice, parallel_tool_calls=parallel,
                      images=tuple(images.images))


def _tools(value: Any) -> tuple[Tool, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise invalid("'tools' must be a list of function tools", "tools", "invalid_type")
    tools = []
    for i, item in enumerate(value):
        fn = item.get("function") if isinstance(item, dict) and item.get("type") == "function" else None
        if not isinstance(fn, dict):
            raise invalid(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}", f"tools[{i}]")
        tools.append(function_tool(fn.get("name"), fn.get("description"), fn.get("parameters"),
                                   f"tools[{i}].function"))
    return distinct_tools(tools)


def _tool_choice(value: Any, tools: tuple[Tool, ...]) -> str:
    if value is None or value in ("auto", "none", "required"):
        choice = value
    elif isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("function"), dict):
        choice = value["function"].get("name")
    else:
        raise invalid("'tool_choice' must be auto, none, required or {\"type\": \"function\", ...}", "tool_choice")
    return checked_tool_choice(choice, value, tools)


def _message_tool_calls(value: Any, index: int) -> tuple[ToolCall, ...]:
    if value is None:
        return ()
    param = f"messages[{index}].tool_calls"
    if not isinstance(value, list):
        raise invalid(f"'{param}' must be a list", param, "invalid_type")
    calls = []
    for call in value:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise invalid(f"each of {param} needs a function with a name", param)
        arguments = fn.get("arguments", "{}")
        calls.append(ToolCall(str(call.get("id", "")), fn["name"],
                              arguments if isinstance(arguments, str) else json.dumps(arguments)))
    return tuple(calls)


MAX_PROMPTS = 256  # prompts in one /v1/completions request (each still waits for a slot of its own)


def parse_completion(body: dict[str, Any]) -> CompletionParams:
    prompts = _completion_prompts(body.get("prompt"))
    common = _common(body, logprobs_key_is_int=True)
    best_of = BEST_OF.read(body, common.n)
    if common.beam is not None and best_of != common.n:
        raise invalid("'best_of' does not combine with beam search (n is the beam width)", "best_of")
    if best_of < common.n:
        raise invalid(f"'best_of' ({best_of}) must be at least 'n' ({common.n})", "best_of")
    if best_of > common.n and common.stream:
        raise invalid("'best_of' cannot be streamed: the best choices are known only at the end", "best_of")
    echo = ECHO.read(body, False)
    if common.max_tokens == 0 and not echo:
        raise invalid("'max_tokens' 0 generates nothing: it is for scoring a prompt, with 'echo': true", "max_tokens")
    if echo and common.stream and common.n_top_logprobs is not None:
        raise invalid("'echo' with 'logprobs' is not streamed; send stream: false", "echo")
    suffix = SUFFIX.read(body) or None
    if suffix is not None and echo:
        raise invalid("'echo' does not combine with 'suffix'", "echo")
    return CompletionParams(common=common, prompts=prompts, best_of=best_of, echo=echo, suffix=suffix)


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool)
                                                           for t in value)


def _completion_prompts(prompt: Any) -> tuple[str | tuple[int, ...], ...]:
    """The prompt as OpenAI takes it: a text, token ids, or a batch of either (a list of texts, or
    of token id lists), each answered with its own choices."""
    if prompt is None:
        raise invalid("'prompt' is required", "prompt", "missing_required_parameter")
    if isinstance(prompt, str):
        return (prompt,)
    if _is_token_ids(prompt):
        return (tuple(prompt),)
    if isinstance(prompt, list) and prompt and (all(isinstance(p, str) for p in prompt)
                                                or all(_is_token_ids(p) for p in prompt)):
        if len(prompt) > MAX_PROMPTS:
            raise invalid(f"'prompt' holds {len(prompt)} prompts; send at most {MAX_PROMPTS} in one request",
                          "prompt")
        return tuple(p if isinstance(p, str) else tuple(p) for p in prompt)
    raise invalid("'prompt' must be a string, a list of token ids, or a non-empty list of either (one per "
                  "prompt)", "prompt", "invalid_type")


MAX_EMBEDDING_INPUTS = 2048  # as OpenAI's API
ENCODING_FORMAT = Field("encoding_format", "string", "float (default) or base64 (little-endian float32)")
DIMENSIONS = Field("dimensions", "integer", "the vector size: only the model's own", 1)


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)


def parse_embeddings(body: dict[str, Any]) -> EmbeddingParams:
    value = body.get("input")
    if value is None:
        raise invalid("'input' is required", "input", "missing_required_parameter")
    if isinstance(value, str) or _is_ids(value):
        value = [value]
    if not isinstance(value, list) or not value:
        raise invalid("'input' must be a string, a list of strings, token ids, or a list of token id lists",
                      "input", "invalid_type")
    if len(value) > MAX_EMBEDDING_INPUTS:
        raise invalid(f"'input' holds {len(value)} items; at most {MAX_EMBEDDING_INPUTS}", "input")
    if all(isinstance(v, str) for v in value):
        if any(not v for v in value):
            raise invalid("'input' must not contain an empty string", "input")
    elif not all(_is_ids(v) for v in value):
        raise invalid("'input' must be all strings or all non-empty token id lists", "input", "invalid_type")
    fmt = ENCODING_FORMAT.read(body, "float")
    if fmt not in ("float", "base64"):
        raise invalid(f"'encoding_format' must be float or base64, got {json.dumps(fmt)}", "encoding_format")
    return EmbeddingParams(model=MODEL.read(body), inputs=value, encoding_format=fmt, dimensions=DIMENSIONS.read(body))
