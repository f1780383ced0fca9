"""Ollama's API through the official `ollama` client against a real `runner serve` (SmolLM2)."""

from __future__ import annotations

import base64

import json
from collections.abc import Callable, Iterator

import httpx
import jsonschema
import numpy as np
import ollama
import pytest
from server_process import ServerProcess
from tiny_mmproj import png_bytes

pytestmark = pytest.mark.model
MODEL = "smollm2-135m-instruct"
GREEDY = {"temperature": 0, "num_predict": 16}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def server(serve_smollm2: Callable[..., ServerProcess]) -> ServerProcess:
    return serve_smollm2("--parallel", "2", "--ctx-size", "2048")


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[ollama.Client]:
    with ollama.Client(host=server.url) as c:
        yield c


def openai_reply(server: ServerProcess, messages: list[dict], max_tokens: int = 16) -> str:
    reply = server.post("/v1/chat/completions", json={"messages": messages, "temperature": 0,
                                                      "max_tokens": max_tokens})
    return reply.json()["choices"][0]["message"]["content"]


def test_list_show_ps_and_version_describe_the_model(client: ollama.Client, server: ServerProcess) -> None:
    (listed,) = client.list().models
    assert listed.model == MODEL and listed.size == 98_362_432 and len(listed.digest or "") == 64
    assert (listed.details.family, listed.details.quantization_level, listed.details.parameter_size) == (
        "llama", "Q4_1", "134.5M")
    shown = client.show(MODEL)
    assert "completion" in (shown.capabilities or []) and shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["llama.context_length"] == 8192 and "<|im_start|>" in (shown.template or "")
    (running,) = client.ps().models
    assert running.model == MODEL and running.size and running.expires_at.year == 9999
    assert running.context_length == 2048  # a slot's (--ctx-size), not the GGUF's 8192
    assert server.get("/api/version").json()["version"]


def test_chat_whole_and_streamed_equal_the_openai_reply(client: ollama.Client, server: ServerProcess) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a fruit."}]
    whole = client.chat(model=MODEL, messages=messages, options=GREEDY)
    parts = list(client.chat(model=MODEL, messages=messages, options=GREEDY, stream=True))
    assert whole.message.content == openai_reply(server, messages)
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    final = parts[-1]
    assert final.done_reason == whole.done_reason and final.eval_count == whole.eval_count
    for done in (whole, final):  # plausible, not timed
        assert done.total_duration >= done.eval_duration > 0 and done.prompt_eval_duration > 0
        assert done.eval_count >= 1 and done.load_duration == 0


def test_generate_as_a_chat_turn_and_raw(client: ollama.Client, server: ServerProcess) -> None:
    generated = client.generate(model=MODEL, prompt="Name a colour.", system="Be brief.", options=GREEDY)
    assert generated.response == openai_reply(server, [{"role": "system", "content": "Be brief."},
                                                       {"role": "user", "content": "Name a colour."}])
    raw = client.generate(model=MODEL, prompt="Once upon a time", raw=True, options=GREEDY)
    completion = server.post("/v1/completions", json={"prompt": "Once upon a time", "temperature": 0,
                                                      "max_tokens": 16}).json()
    assert raw.response == completion["choices"][0]["text"] and raw.done_reason == "length"


def test_format_takes_a_json_schema_and_json(client: ollama.Client) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    reply = client.chat(model=MODEL, messages=[{"role": "user", "content": "Describe a person as JSON."}],
                        format=schema, options={"temperature": 0, "num_predict": 60})
    jsonschema.validate(json.loads(reply.message.content), schema)
    anything = client.generate(model=MODEL, prompt="Give a JSON object with one key, name.", format="json",
                               options={"temperature": 0, "num_predict": 120})
    assert isinstance(json.loads(anything.response), dict)



def test_a_schema_that_says_nothing_of_other_keys_gets_only_its_own(client: ollama.Client) -> None:
    """As llama.cpp's server (and Ollama) reads it: pydantic's model_json_schema() says nothing of
    additionalProperties, and read by the JSON Schema rule SmolLM2 added keys to the token limit
    ('tails', 'eyes', 'tails', ...) and never closed the object."""
    schema = {"type": "object", "title": "Pet", "required": ["name", "legs"],
              "properties": {"name": {"type": "string", "title": "Name"}, "legs": {"type": "integer", "title": "Legs"}}}
    reply = client.chat(model=MODEL, messages=[{"role": "user", "content": "Invent a pet."}], format=schema,
                        options={"temperature": 0, "num_predict": 200})
    assert reply.done_reason == "stop" and set(json.loads(reply.message.content)) == {"name", "legs"}


def test_a_tool_call_comes_back_with_arguments_as_an_object_and_its_result_is_used(client: ollama.Client,
                                                                                   server: ServerProcess) -> None:
    ask = [{"role": "user", "content": "What's the weather in Paris?"}]
    # SmolLM2 does not call a tool of its own accord: tool_choice (an extension) makes it
    body = {"model": MODEL, "messages": ask, "tools": [WEATHER], "tool_choice": "required", "stream": False,
            "options": {"temperature": 0, "num_predict": 60}}
    reply = ollama.ChatResponse.model_validate(server.post("/api/chat", json=body).json())
    (call,) = reply.message.tool_calls or []
    assert (call.function.name, dict(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    streamed = server.post("/api/chat", json={**body, "stream": True}).text.splitlines()
    assert json.loads(streamed[0])["message"]["tool_calls"] == [
        {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]
    answers = {result: client.chat(model=MODEL, tools=[WEATHER], options={"temperature": 0, "num_predict": 24},
                                   messages=[*ask, reply.message, {"role": "tool", "content": result,
                                                                   "tool_name": "get_weather"}]).message.content
               for result in ("Sunny, 24 degrees", "Rain, 9 degrees")}
    assert len(set(answers.values())) == 2  # the result reached the prompt: another result, another reply


def test_embed_equals_the_openai_embeddings(client: ollama.Client, server: ServerProcess) -> None:
    texts = ["a red bicycle", "the sea"]
    embedded = client.embed(model=MODEL, input=texts)
    theirs = server.post("/v1/embeddings", json={"input": texts}).json()
    assert [list(v) for v in embedded.embeddings] == [d["embedding"] for d in theirs["data"]]
    older = client.embeddings(model=MODEL, prompt="the sea")
    assert list(older.embedding) == theirs["data"][1]["embedding"]
    assert list(client.embeddings(model=MODEL, prompt="").embedding) == []  # as Ollama answers it


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}, 404, "The model 'nope' does not exist"),
    ({"messages": [{"role": "user", "content": "hi"}], "options": {"temperature": "hot"}}, 400,
     "'temperature' must be a number"),
    ({"messages": [{"role": "user", "content": "hi"}], "options": {"num_ctx": 100000}}, 400,
     "num_ctx 100000 is more than a slot holds here (2048 tokens)"),
    ({"messages": [{"role": "user", "content": "what is this?", "images": [base64.b64encode(png_bytes(8, 8)).decode()]}]},
     400, "messages.0.images.0: this model takes no images"),
    ({"messages": [{"role": "user", "content": "what is this?", "images": ["iVBORw0KGgo="]}]}, 400,
     "messages.0.images.0: not an image this server reads"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0: role must be"),
    ({"messages": [{"role": "user", "content": "hi"}], "format": "yaml"}, 400, "format must be"),
    ({"messages": [{"role": "assistant", "content": "x", "tool_calls": 5}]}, 400,
     "messages.0.tool_calls must be a list"),
    ({"messages": [{"role": "user", "content": "hi"}], "options": {"stop": ["."] * 65}}, 400,
     "'stop' takes at most 64 strings"),
    ({"messages": [], "keep_alive": "forever"}, 400, "keep_alive must be a duration"),  # (as a router says)
])
def test_bad_input_is_a_4xx_in_ollamas_envelope(server: ServerProcess, body: dict, status: int, message: str) -> None:
    reply = server.post("/api/chat", json={"model": MODEL, **body})
    assert reply.status_code == status and list(reply.json()) == ["error"]
    assert reply.json()["error"].startswith(message)


def test_malformed_json_without_a_content_type_and_nothing_left_in_a_slot(server: ServerProcess) -> None:
    reply = httpx.post(server.url + "/api/generate", content=b'{"model": "x", ', timeout=30)
    assert reply.status_code == 400 and "error" in reply.json()
    plain = httpx.post(server.url + "/api/generate", timeout=60,  # as Ollama's curl examples send it
                       content=json.dumps({"model": MODEL, "prompt": "Hi", "stream": False,
                                           "options": {"num_predict": 2}}).encode())
    assert plain.status_code == 200 and plain.json()["done"] is True
    assert [s["state"] for s in server.wait_all_idle(timeout_s=30)] == ["idle"] * 2


def test_an_empty_request_answers_that_the_model_is_loaded(client: ollama.Client) -> None:
    assert client.generate(model=MODEL, prompt="").done_reason == "load"
    assert client.chat(model=MODEL, messages=[]).done_reason == "load"
    for empty in ({}, {"input": ""}, {"input": []}):  # (/api/embed's way to load a model: it answered a 400)
        reply = client.embed(model=MODEL, **empty)
        assert (list(reply.embeddings), reply.prompt_eval_count) == ([], 0)


def test_delete_refuses_the_served_model_and_pull_an_unknown_name(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as in_use:
        client.delete(MODEL)
    assert in_use.value.status_code == 409
    with pytest.raises(ollama.ResponseError) as unknown:
        client.pull("no-such-model")
    assert unknown.value.status_code == 404 and "no-such-model" in unknown.value.error
    with pytest.raises(ollama.ResponseError) as unreadable:
        client.pull("hf.co/org")  # (it was a 500 "internal error: PullError")
    assert unreadable.value.status_code == 400 and "hf.co/ORG/REPO" in unreadable.value.error


def test_copy_and_create_say_they_are_not_supported(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as copied:
        client.copy(MODEL, "mine")
    assert copied.value.status_code == 501 and "/api/copy is not supported here" in copied.value.error
    with pytest.raises(ollama.ResponseError) as created:
        client.create(model="mine", from_=MODEL, system="be brief")
    assert created.value.status_code == 501 and "/api/create" in created.value.error


def test_prompt_eval_count_is_the_whole_prompt_when_the_cache_serves_it(client: ollama.Client,
                                                                        server: ServerProcess) -> None:
    messages = [{"role": "user", "content": "Count the prompt's tokens, all of them."}]
    counts = [client.chat(model=MODEL, messages=messages, options=GREEDY).prompt_eval_count for _ in range(2)]
    usage = server.post("/v1/chat/completions", json={"messages": messages, "temperature": 0,
                                                      "max_tokens": 1}).json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0  # (the cache served it: it was counted out)
    assert counts == [usage["prompt_tokens"]] * 2


def test_an_integer_option_may_be_a_whole_number_float(server: ServerProcess) -> None:
    body = {"model": MODEL, "prompt": "Once upon a time", "raw": True, "stream": False,
            "options": {"num_predict": 3.0, "seed": 7.0, "top_k": 1.0}}
    reply = server.post("/api/generate", json=body).json()
    assert (reply["eval_count"], reply["done_reason"]) == (3, "length")
    refused = server.post("/api/generate", json={**body, "options": {"num_predict": 3.5}})
    assert (refused.status_code, refused.json()) == (400, {"error": "'num_predict' must be an integer, got 3.5"})


@pytest.fixture(scope="module")
def short_context(serve_smollm2: Callable[..., ServerProcess]) -> Iterator[ollama.Client]:
    """A server whose embedding context holds 256 tokens (as tests/server/test_embeddings.py starts it)."""
    with ollama.Client(host=serve_smollm2("--parallel", "2", "--ctx-size", "256").url) as c:
        yield c


LONG = "hello " * 300  # 301 tokens
FIRST_256 = "hello" + " hello" * 255  # its first 256


def test_embed_truncates_an_input_too_long_unless_told_not_to(short_context: ollama.Client) -> None:
    truncated = short_context.embed(model=MODEL, input=[LONG, "the sea"])
    assert truncated.prompt_eval_count == 256 + short_context.embed(model=MODEL, input="the sea").prompt_eval_count
    assert list(truncated.embeddings[0]) == list(short_context.embed(model=MODEL, input=FIRST_256).embeddings[0])
    huge = short_context.embed(model=MODEL, input="hello " * 7_000)  # (more characters than the server tokenizes)
    assert huge.prompt_eval_count == 256 and list(huge.embeddings[0]) == list(truncated.embeddings[0])
    with pytest.raises(ollama.ResponseError) as refused:
        short_context.embed(model=MODEL, input=LONG, truncate=False)
    assert (refused.value.status_code, refused.value.error) == (
        400, "input 0 has 301 tokens; an embedding input holds at most 256")


def test_embed_dimensions_are_the_first_values_at_unit_length(client: ollama.Client, server: ServerProcess) -> None:
    (full,) = client.embed(model=MODEL, input="the sea").embeddings
    (short,) = client.embed(model=MODEL, input="the sea", dimensions=64).embeddings
    head = np.array(full[:64])
    np.testing.assert_allclose(short, head / np.linalg.norm(head), rtol=1e-5)
    assert list(client.embed(model=MODEL, input="the sea", dimensions=576).embeddings[0]) == list(full)
    for ignored in (100_000, 0, -3):  # (Ollama gives the whole vector for these)
        assert list(client.embed(model=MODEL, input="the sea", dimensions=ignored).embeddings[0]) == list(full)
    refused = server.post("/api/embed", json={"model": MODEL, "input": "hi", "dimensions": "64"})
    assert (refused.status_code, refused.json()) == (400, {"error": "'dimensions' must be an integer, got \"64\""})
