"""A real `runner serve` with SmolLM2 on 127.0.0.1, driven by the official openai client."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest

from runner.prompt.chat_template import Message
from runner.model.loaded_model import LoadedModel
from runner.config.options import EngineOptions
from server_process import ServerProcess

pytestmark = pytest.mark.model
MODEL = "smollm2-135m-instruct"
COUNTING = "1, 2, 3, 4, 5, 6, 7,"  # greedy SmolLM2 keeps counting: a reply that outlasts the test
QUESTIONS = [
    "What is the capital of France?", "Name a primary colour.", "Say hello in Spanish.", "What is 2 + 2?",
    "Name a fruit that is yellow.", "What do bees make?", "Name a planet.", "What colour is the sky?",
]


@pytest.fixture(scope="module")
def server(serve_smollm2: Callable[..., ServerProcess]) -> ServerProcess:
    return serve_smollm2("--parallel", "4", "--ctx-size", "1024", "--alias", "my-model")


@pytest.fixture(scope="module")
def client(server: ServerProcess):
    with server.openai_client() as c:  # closes its connections at the end of the module
        yield c


@pytest.fixture(scope="module")
def tokenizer(smollm2_path: Path):
    loaded = LoadedModel(smollm2_path, EngineOptions(parallel=1, ctx_size=256), log=lambda _: None)
    yield loaded
    loaded.close()


def ask(client: openai.OpenAI, question: str, max_tokens: int = 24) -> str:
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": question}], temperature=0, max_tokens=max_tokens
    )
    return r.choices[0].message.content or ""


# -- OpenAI surface -------------------------------------------------------------------------

def test_chat_whole_usage_matches_tokenizer(client: openai.OpenAI, tokenizer: LoadedModel) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTIONS[0]}], temperature=0, max_tokens=32,
        logprobs=True, top_logprobs=3,
    )
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert r.usage.prompt_tokens == len(tokenizer.chat_prompt_ids([Message("user", QUESTIONS[0])]))
    assert r.usage.completion_tokens == len(choice.logprobs.content)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    for entry in choice.logprobs.content:  # greedy: the chosen token is the most likely one
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)


def test_chat_stream_matches_whole_with_role_first_and_usage_chunk(client: openai.OpenAI) -> None:
    whole = ask(client, QUESTIONS[1], 32)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTIONS[1]}], temperature=0, max_tokens=32,
        stream=True, stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in chunks[1:] if c.choices)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert len(usage_chunks) == 1 and usage_chunks[0] is chunks[-1] and chunks[-1].choices == []
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] in (["stop"], ["length"])


def test_stream_helper_final_message_is_assistant(client: openai.OpenAI) -> None:
    with client.chat.completions.stream(
        model=MODEL, messages=[{"role": "user", "content": QUESTIONS[3]}], temperature=0, max_tokens=200
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert final.choices[0].message.role == "assistant"
    assert final.choices[0].message.content


def test_completions_whole_and_stream(client: openai.OpenAI, tokenizer: LoadedModel) -> None:
    prompt = "The three primary colours are"
    whole = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=12, logprobs=2)
    assert whole.object == "text_completion"
    assert whole.usage.prompt_tokens == len(tokenizer.text_prompt_ids(prompt))
    assert whole.usage.completion_tokens == 12 == len(whole.choices[0].logprobs.tokens)
    assert whole.choices[0].finish_reason == "length"
    assert "".join(whole.choices[0].logprobs.tokens) == whole.choices[0].text
    # NOTE: the openai package types a completion chunk's finish_reason as non-null, but the API (OpenAI's
    # own too) sends null until the last chunk (openai/openai-openapi#100), so strict validation cannot
    # parse any conformant stream; this one call uses a lenient client and checks the fields itself.
    lenient = openai.OpenAI(base_url=client.base_url, api_key="unused", max_retries=0)
    chunks = list(lenient.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=12, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    assert {c.object for c in chunks} == {"text_completion"}


def test_stop_string_and_max_completion_tokens(client: openai.OpenAI) -> None:
    full = ask(client, QUESTIONS[0], 32)
    stop = full.split()[2]
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTIONS[0]}], temperature=0,
        max_completion_tokens=32, stop=[stop],
    )
    assert r.choices[0].message.content == full[: full.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    short = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTIONS[0]}], temperature=0, max_completion_tokens=3
    )
    assert short.usage.completion_tokens == 3 and short.choices[0].finish_reason == "length"


def test_seeded_sampling_reproducible(client: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        return client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Tell me about dogs."}], temperature=1.0,
            max_tokens=24, seed=seed,
        ).choices[0].message.content

    assert sample(11) == sample(11)
    assert len({sample(1), sample(2), sample(3)}) > 1


def test_models_health_and_alias(server: ServerProcess, client: openai.OpenAI) -> None:
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL, "my-model"]
    assert server.get("/health").json() == {"status": "ok", "model": MODEL, "slot_context": 1024}
    r = client.chat.completions.create(model="my-model", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert r.model == "my-model"


def wait_for_queue_depth(server: ServerProcess, depth: int, headers: dict[str, str] | None = None) -> bool:
    deadline = time.time() + 30  # (a bound on waiting for the server, not a speed: a loaded CI takes longer)
    while time.time() < deadline:
        if f"runner_queue_depth {depth}\n" in server.get("/metrics", headers=headers or {}).text:
            return True
        time.sleep(0.02)
    return False


# -- parallel sessions --------------------------------------------------------------------

def test_concurrent_requests_equal_their_solo_runs(client: openai.OpenAI, server: ServerProcess) -> None:
    alone = [ask(client, q, 40) for q in QUESTIONS]
    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        together = list(pool.map(lambda q: ask(client, q, 40), QUESTIONS))
    assert together == alone
    slots = server.wait_all_idle()
    assert [s["state"] for s in slots] == ["idle"] * 4


def test_disconnect_frees_the_slot_and_the_queued_request_starts(server: ServerProcess) -> None:
    body = {"model": MODEL, "prompt": COUNTING, "max_tokens": 900, "temperature": 0, "stream": True}
    streams, request_ids, readers = [], [], []
    for _ in range(4):  # occupy every slot
        cm = httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60)
        # NOTE: keep the line iterator alive: dropping it makes httpx close the connection (a disconnect)
        reader = (line for line in cm.__enter__().iter_lines() if line.startswith("data: "))
        request_ids.append(json.loads(next(reader)[6:])["id"])
        streams.append(cm)
        readers.append(reader)
    busy = server.get("/slots").json()
    assert [s["state"] for s in busy] == ["generating"] * 4
    first_chunk: list[str] = []
    waiter = threading.Thread(target=lambda: first_chunk.append(
        httpx.post(server.url + "/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}).text))
    waiter.start()
    assert wait_for_queue_depth(server, 1)
    victim = request_ids[0]
    assert sorted(s["request_id"] for s in busy) == sorted(request_ids)
    streams[0].__exit__(None, None, None)  # the client goes away mid-stream
    waiter.join(timeout=30)
    assert first_chunk and json.loads(first_chunk[0])["usage"]["completion_tokens"] >= 1
    assert victim not in [s["request_id"] for s in server.get("/slots").json()]
    for cm in streams[1:]:
        cm.__exit__(None, None, None)
    slots = server.wait_all_idle(timeout_s=30)  # (a bound on waiting: a loaded CI notices disconnects later)
    assert [s["state"] for s in slots] == ["idle"] * 4


def test_slots_and_metrics_shape(server: ServerProcess, client: openai.OpenAI) -> None:
    ask(client, QUESTIONS[3], 4)
    slots = server.get("/slots").json()
    assert [s["id"] for s in slots] == [0, 1, 2, 3]
    assert set(slots[0]) == {"id", "state", "request_id", "n_cached", "n_generated", "n_prompt", "n_prompt_reused",
                             "draft_k", "draft_acceptance"}
    assert max(s["n_cached"] for s in slots) > 0
    text = server.get("/metrics").text
    for name in ("runner_requests_total", "runner_prompt_tokens_total", "runner_generated_tokens_total",
                 "runner_queue_depth", "runner_slots_busy", "runner_decode_seconds_total"):
        assert f"\n{name} " in text or text.startswith(f"{name} ") or f"# TYPE {name} " in text


# -- bad input ----------------------------------------------------------------------------

MSG = [{"role": "user", "content": "Hi"}]


def test_bad_input_gets_the_envelope_over_http(server: ServerProcess) -> None:
    # every validation case is in test_openai_params.py; here the envelope as it leaves the real server
    r = server.post("/v1/chat/completions", json={"messages": MSG, "temperature": "hot"})
    assert r.status_code == 400
    assert r.json() == {"error": {"message": "'temperature' must be a number, got \"hot\"",
                                  "type": "invalid_request_error", "param": "temperature", "code": "invalid_type"}}
    assert server.post("/v1/chat/completions", json={"messages": MSG, "model": "gpt-4o"}).status_code == 404


def test_bad_completion_input(server: ServerProcess) -> None:
    for body, param in [({}, "prompt"), ({"prompt": 3}, "prompt"), ({"prompt": [999999]}, "prompt"),
                        ({"prompt": "x", "logprobs": 9}, "logprobs")]:
        r = server.post("/v1/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_an_empty_prompt_completes_from_the_start_of_a_document(client: openai.OpenAI,
                                                                tokenizer: LoadedModel) -> None:
    """As OpenAI's: the model writes as from a new document (it was a 400, 'the prompt is empty').
    logprobs 0 still gives each token's own entry (it gave [{}])."""
    empty = client.completions.create(model=MODEL, prompt="", temperature=0, max_tokens=4, logprobs=0)
    assert empty.usage.prompt_tokens == 1 and empty.choices[0].text
    assert [list(top) for top in empty.choices[0].logprobs.top_logprobs] == [[t] for t in empty.choices[0].logprobs.tokens]
    bos = tokenizer.model.bos_id
    by_id = client.completions.create(model=MODEL, prompt=[bos], temperature=0, max_tokens=4)
    assert by_id.choices[0].text == empty.choices[0].text


def test_prompt_longer_than_a_slot_gives_the_numbers(server: ServerProcess) -> None:
    r = server.post("/v1/completions", json={"prompt": "word " * 1500, "max_tokens": 4})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded"
    assert "tokens but a slot's context holds 1024" in err["message"]


def test_a_model_is_retrieved_by_its_id(server: ServerProcess, client: openai.OpenAI) -> None:
    listed = client.models.list().data
    assert client.models.retrieve(listed[0].id).id == listed[0].id  # (it was a 404)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_wrong_route_and_method(server: ServerProcess) -> None:
    assert server.get("/v1/nothing").json()["error"]["code"] == "not_found"
    r = server.get("/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


def test_server_keeps_serving_after_bad_input(server: ServerProcess, client: openai.OpenAI) -> None:
    server.post("/v1/chat/completions", content=b"\xff\xfe")
    assert ask(client, QUESTIONS[3], 8)


# -- API key and queue bound (a second, small server) -------------------------------------

@pytest.fixture(scope="module")
def guarded(serve_smollm2: Callable[..., ServerProcess]) -> ServerProcess:
    return serve_smollm2("--parallel", "1", "--max-queue", "1", "--api-key", "s3cret", "--ctx-size", "1024")


def test_api_key_is_required(guarded: ServerProcess) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        r = guarded.post("/v1/chat/completions", json={"messages": MSG}, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert guarded.get("/v1/models").status_code == 401
    ok = openai.OpenAI(base_url=guarded.url + "/v1", api_key="s3cret", _strict_response_validation=True)
    assert ok.chat.completions.create(model=MODEL, messages=MSG, max_tokens=2).choices[0].message.content is not None


def test_queue_full_gives_503_with_retry_after(guarded: ServerProcess) -> None:
    auth = {"Authorization": "Bearer s3cret"}
    long_body = {"model": MODEL, "prompt": COUNTING, "max_tokens": 600, "stream": True, "temperature": 0}
    with httpx.stream("POST", guarded.url + "/v1/completions", json=long_body, headers=auth, timeout=60) as first:
        reader = first.iter_lines()  # kept alive: dropping it would close the connection
        next(reader)
        queued = threading.Thread(target=lambda: guarded.post("/v1/chat/completions", headers=auth,
                                                              json={"messages": MSG, "max_tokens": 2}))
        queued.start()
        assert wait_for_queue_depth(guarded, 1, auth)
        r = guarded.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 2}, headers=auth)
        assert r.status_code == 503
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "queue_full"
    queued.join(timeout=30)
    assert [s["state"] for s in guarded.wait_all_idle(headers=auth)] == ["idle"]
