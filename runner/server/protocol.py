"""Parse and validate OpenAI request bodies into plain objects; raw JSON stops here."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from runner.chat_template import ROLES, Message
from runner.sampling import SamplingParams
from runner.server.errors import ApiError, invalid
from runner.server.guards import MAX_JSON_DEPTH, check_json_value

MAX_STOP_STRINGS = 4
MAX_TOP_LOGPROBS = 20
_DEFAULTS = SamplingParams()


@dataclass(frozen=True)
class CommonParams:
    model: str | None
    sampling: SamplingParams
    max_tokens: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    n_top_logprobs: int | None
    ignore_eos: bool  # extension (as llama.cpp's server): generate max_tokens even past end-of-text


@dataclass(frozen=True)
class ChatParams:
    common: CommonParams
    messages: list[Message]


@dataclass(frozen=True)
class CompletionParams:
    common: CommonParams
    prompt: str | tuple[int, ...]


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; nesting, huge integers and lone surrogates are refused here."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise invalid(f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        raise invalid(f"the request body nests deeper than {MAX_JSON_DEPTH} levels", code="invalid_json") from None
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise invalid(f"the request body holds a value that cannot be read: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object", code="invalid_json")
    check_json_value(body)
    return body


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number(body: dict, key: str, lo: float, hi: float, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if not _is_number(value):
        raise invalid(f"'{key}' must be a number, got {json.dumps(value)}", key, "invalid_type")
    if not lo <= value <= hi:
        raise invalid(f"'{key}' must be between {lo} and {hi}, got {value}", key)
    return float(value)


def _integer(body: dict, key: str, lo: int, hi: int | None = None, default: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"'{key}' must be an integer, got {json.dumps(value)}", key, "invalid_type")
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise invalid(f"'{key}' must be {bound}, got {value}", key)
    return value


def _boolean(body: dict, key: str, default: bool = False) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"'{key}' must be a boolean, got {json.dumps(value)}", key, "invalid_type")
    return value


def _stop(body: dict) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise invalid("'stop' must be a string or a list of strings", "stop", "invalid_type")
    if len(value) > MAX_STOP_STRINGS:
        raise invalid(f"'stop' takes at most {MAX_STOP_STRINGS} strings, got {len(value)}", "stop")
    return tuple(s for s in value if s)


def _common(body: dict, logprobs_key_is_int: bool) -> CommonParams:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid("'model' must be a string", "model", "invalid_type")
    n = _integer(body, "n", 1, None, 1)
    if n != 1:
        raise invalid(f"'n' must be 1: this server returns one choice per request (got n={n})", "n", "unsupported_value")
    stream = _boolean(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise invalid("'stream_options' must be an object", "stream_options", "invalid_type")
    include_usage = _boolean(options or {}, "include_usage")
    max_tokens = _integer(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", 1)
    if logprobs_key_is_int:  # /v1/completions: logprobs is the number of alternatives
        n_top = _integer(body, "logprobs", 0, 5)
    else:
        n_top = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) if _boolean(body, "logprobs") else None
        if n_top is None and _boolean(body, "logprobs"):
            n_top = 0
        if body.get("top_logprobs") is not None and not _boolean(body, "logprobs"):
            raise invalid("'top_logprobs' requires 'logprobs': true", "top_logprobs")
    seed = _integer(body, "seed", -(2**63), 2**64 - 1)
    sampling = SamplingParams(
        temperature=_number(body, "temperature", 0.0, 2.0, _DEFAULTS.temperature),
        top_k=int(_integer(body, "top_k", 0, None, _DEFAULTS.top_k) or 0),
        top_p=_number(body, "top_p", 0.0, 1.0, _DEFAULTS.top_p),
        min_p=_number(body, "min_p", 0.0, 1.0, _DEFAULTS.min_p),
        repeat_penalty=_number(body, "repeat_penalty", 0.01, 10.0, _DEFAULTS.repeat_penalty),
        presence_penalty=_number(body, "presence_penalty", -2.0, 2.0, _DEFAULTS.presence_penalty),
        frequency_penalty=_number(body, "frequency_penalty", -2.0, 2.0, _DEFAULTS.frequency_penalty),
        seed=None if seed is None else seed % 2**64,
    )
    ignore_eos = _boolean(body, "ignore_eos")
    return CommonParams(model, sampling, max_tokens, _stop(body), stream, include_usage, n_top, ignore_eos)


def _content(value: Any, index: int, role: str) -> str:
    if value is None and role == "assistant":
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts: only text is understood here
        texts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise invalid(
                    f"messages[{index}].content: only text parts are supported", f"messages[{index}].content"
                )
            texts.append(part["text"])
        return "".join(texts)
    raise invalid(f"messages[{index}].content must be a string", f"messages[{index}].content", "invalid_type")


def parse_chat(body: dict[str, Any]) -> ChatParams:
    messages = body.get("messages")
    if messages is None:
        raise invalid("'messages' is required", "messages", "missing_required_parameter")
    if not isinstance(messages, list):
        raise invalid("'messages' must be a list of messages", "messages", "invalid_type")
    if not messages:
        raise invalid("'messages' must contain at least one message", "messages", "empty_array")
    parsed = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise invalid(f"messages[{i}] must be an object", f"messages[{i}]", "invalid_type")
        role = m.get("role")
        if role not in ROLES:
            raise invalid(f"messages[{i}].role must be one of {', '.join(ROLES)}; got {json.dumps(role)}", f"messages[{i}].role")
        parsed.append(Message("system" if role == "developer" else role, _content(m.get("content"), i, role)))
    return ChatParams(_common(body, logprobs_key_is_int=False), parsed)


def parse_completion(body: dict[str, Any]) -> CompletionParams:
    prompt = body.get("prompt")
    if prompt is None:
        raise invalid("'prompt' is required", "prompt", "missing_required_parameter")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        prompt = tuple(prompt)
    elif not isinstance(prompt, str):
        raise invalid("'prompt' must be a string, a list of one string, or a list of token ids", "prompt", "invalid_type")
    return CompletionParams(_common(body, logprobs_key_is_int=True), prompt)


def check_model(requested: str | None, served: list[str]) -> None:
    if requested is not None and requested not in served:
        raise ApiError(
            404, f"The model '{requested}' does not exist; this server serves: {', '.join(served)}",
            param="model", code="model_not_found",
        )
