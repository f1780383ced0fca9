"""The HTTP app in-process on the tiny model: failures mid-stream and the engine thread's recovery."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from runner.prompt.chat_template import Message
from runner.server.engine_thread import EngineThread
from runner.model.loaded_model import LoadedModel
from runner.config.options import EngineOptions
from runner.server.app import create_app
from runner.server.request_fields import check_model
from runner.server.state import ServerState

BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 12, "temperature": 0,
        "ignore_eos": True, "stream": True}


@pytest.fixture
def app_state(tiny_gguf: Path) -> Iterator[ServerState]:
    loaded = LoadedModel(tiny_gguf, EngineOptions(parallel=2, ctx_size=128, batch_size=32, threads=1), log=lambda _: None)
    thread = EngineThread(loaded.engine)
    thread.start()
    state = ServerState(loaded, thread, ["tiny"])
    yield state
    state.close()


def sse_events(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def test_a_failed_decode_mid_stream_sends_an_error_event_and_frees_the_slot(app_state: ServerState) -> None:
    runner = app_state.loaded.runner
    real_decode = runner.decode
    calls = {"n": 0}

    def failing_decode(rows):  # the 4th decode of this request fails inside llama.cpp
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("llama_decode failed with code -3: out of memory")
        return real_decode(rows)

    runner.decode = failing_decode
    with TestClient(create_app(app_state), base_url="http://127.0.0.1") as client:
        events = sse_events(client.post("/v1/chat/completions", json=BODY).text)
        runner.decode = real_decode
        chunks = [json.loads(e) for e in events]
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert sum(1 for c in chunks if c.get("choices") and c["choices"][0]["delta"].get("content") is not None) >= 3
        assert chunks[-1] == {"error": {"message": "llama_decode failed with code -3: out of memory",
                                        "type": "server_error", "param": None, "code": "generation_failed"}}
        assert "[DONE]" not in events
        assert [s["state"] for s in client.get("/slots").json()] == ["idle", "idle"]
        # the failed slot's KV is dropped, and the server keeps serving
        again = client.post("/v1/chat/completions", json={**BODY, "stream": False})
        assert again.status_code == 200
        assert again.json()["usage"]["completion_tokens"] == 12
        finished = {line.split()[0]: float(line.split()[1]) for line in client.get("/metrics").text.splitlines()
                    if line.startswith("runner_generations_finished_total")}
        assert finished == {f'runner_generations_finished_total{{reason="{r}"}}': n
                            for r, n in (("stop", 0), ("length", 1), ("cancelled", 0), ("error", 1))}


def test_a_non_streamed_failure_is_a_500_envelope(app_state: ServerState) -> None:
    runner = app_state.loaded.runner

    def broken(rows):
        raise RuntimeError("llama_decode failed with code 1: no KV slot")

    runner.decode = broken
    with TestClient(create_app(app_state), base_url="http://127.0.0.1") as client:
        r = client.post("/v1/chat/completions", json={**BODY, "stream": False})
        assert r.status_code == 500
        assert r.json()["error"]["code"] == "generation_failed"
        assert "no KV slot" in r.json()["error"]["message"]


def test_stream_chunks_are_one_per_token_with_exact_usage(app_state: ServerState) -> None:
    with TestClient(create_app(app_state), base_url="http://127.0.0.1") as client:
        body = {**BODY, "stream_options": {"include_usage": True}, "logprobs": True}
        chunks = [json.loads(e) for e in sse_events(client.post("/v1/chat/completions", json=body).text) if e != "[DONE]"]
        token_chunks = [c for c in chunks if c["choices"] and c["choices"][0]["logprobs"]]
        assert sum(len(c["choices"][0]["logprobs"]["content"]) for c in token_chunks) == 12
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12
        prompt_ids = app_state.loaded.chat_prompt_ids([Message("user", "hello")])
        assert chunks[-1]["usage"]["prompt_tokens"] == len(prompt_ids)


def test_a_request_without_max_tokens_stops_at_the_server_default(tiny_gguf: Path) -> None:
    from engines import load_tiny

    loaded = load_tiny(tiny_gguf, 1, ctx_size=128, batch_size=32, max_tokens=5)
    thread = EngineThread(loaded.engine)
    thread.start()
    state = ServerState(loaded, thread, ["tiny"])
    with TestClient(create_app(state), base_url="http://127.0.0.1") as client:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "ignore_eos": True}
        r = client.post("/v1/chat/completions", json=body)
        assert r.json()["usage"]["completion_tokens"] == 5 and r.json()["choices"][0]["finish_reason"] == "length"


def test_logit_bias_is_enforced_and_checked_against_the_vocabulary(app_state: ServerState) -> None:
    with TestClient(create_app(app_state), base_url="http://127.0.0.1") as client:
        body = {**BODY, "stream": False, "max_tokens": 3}
        forced = app_state.loaded.model.tokenize("zz", add_special=False, parse_special=False)[0]
        r = client.post("/v1/chat/completions", json={**body, "logit_bias": {str(forced): 100}}).json()
        text = app_state.loaded.model.token_bytes(forced).decode() * 3
        assert r["choices"][0]["message"]["content"] == text  # +100: that token every time
        r = client.post("/v1/chat/completions", json={**body, "logit_bias": {"999999": 5}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias"


@pytest.mark.parametrize("reasoning_format", ["deepseek", "none"])
def test_a_think_block_becomes_reasoning_content(app_state: ServerState, reasoning_format: str) -> None:
    app_state.reasoning_format = reasoning_format
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "temperature": 0.9, "seed": 3,
            "max_tokens": 40,
            "grammar": 'root ::= "<think>" "plan " [a-c] "</think>" "answer"'}  # the reply a reasoning model writes
    with TestClient(create_app(app_state), base_url="http://127.0.0.1") as client:
        whole = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        chunks = [json.loads(e) for e in sse_events(client.post("/v1/chat/completions",
                                                                json={**body, "stream": True}).text) if e != "[DONE]"]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    streamed_reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    streamed_content = "".join(d.get("content", "") for d in deltas)
    if reasoning_format == "none":
        assert whole["content"].startswith("<think>plan ") and "reasoning_content" not in whole
        assert streamed_reasoning == "" and streamed_content.endswith("</think>answer")
    else:
        assert whole["content"] == "answer" and whole["reasoning_content"] in ("plan a", "plan b", "plan c")
        assert (streamed_reasoning, streamed_content) == (whole["reasoning_content"], "answer")


def test_the_server_does_the_first_requests_one_off_work_before_it_answers(app_state: ServerState) -> None:
    model = app_state.loaded.model
    assert "max_token_bytes" not in vars(model)  # (scanned lazily: the whole vocabulary)
    with TestClient(create_app(app_state), base_url="http://127.0.0.1"):
        assert "max_token_bytes" in vars(model)


def test_errors_outside_a_handler_come_in_the_envelope_of_the_paths_dialect(app_state: ServerState,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr("runner.server.ollama_api.parse_chat", broken)
    app = create_app(app_state)
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as client:
        missing = client.post("/v1/messages/xyz", json={})
        assert missing.status_code == 404
        assert missing.json()["type"] == "error" and missing.json()["error"]["type"] == "not_found_error"
        wrong_method = client.get("/v1/messages")
        assert wrong_method.status_code == 405 and wrong_method.json()["error"]["type"] == "api_error"
        assert client.get("/api/nothing").json() == {"error": "Not Found: GET /api/nothing"}
        failed = client.post("/api/chat", json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
        assert (failed.status_code, failed.json()) == (500, {"error": "internal error: RuntimeError"})
        assert client.get("/v1/nothing").json()["error"]["code"] == "not_found"  # OpenAI's, elsewhere


def test_a_whole_reply_cut_by_shutdown_is_a_503_not_a_finished_reply(app_state: ServerState) -> None:
    import threading
    import time

    from runner.server.engine_thread import SHUTTING_DOWN

    gate = threading.Event()  # the engine thread waits here, so the request is queued when SIGTERM's cancel comes
    holding = threading.Thread(target=lambda: app_state.engine_thread.call(gate.wait))
    with TestClient(create_app(app_state), base_url="http://127.0.0.1") as client:
        holding.start()
        answers = []
        body = {**BODY, "stream": False}
        asking = threading.Thread(target=lambda: answers.append(client.post("/v1/chat/completions", json=body)))
        asking.start()
        deadline = time.monotonic() + 60
        while app_state.engine_thread.n_waiting == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        app_state.engine_thread.cancel_all()  # what SIGTERM does
        gate.set()
        asking.join(timeout=60)
        holding.join(timeout=60)
    assert answers[0].status_code == 503  # (was a 200 with finish_reason "stop")
    assert answers[0].json()["error"] == {"message": SHUTTING_DOWN, "type": "server_error", "param": None,
                                          "code": "shutting_down"}


def test_an_alias_equal_to_the_served_name_is_listed_once(app_state: ServerState) -> None:
    """(`serve tiny.gguf --alias tiny`: /v1/models listed the id twice)"""
    app_state.model_ids = ["tiny", "tiny", "other"]
    app_state.__post_init__()
    with TestClient(create_app(app_state), base_url="http://127.0.0.1") as client:
        assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["tiny", "other"]


def test_name_latest_names_the_served_model_unless_a_model_is_named_so(app_state: ServerState) -> None:
    """(`tiny:latest` was a 404: in Ollama NAME and NAME:latest are one model, and apps write the tag.)"""
    with TestClient(create_app(app_state), base_url="http://127.0.0.1") as client:
        chat = client.post("/v1/chat/completions", json={**BODY, "model": "tiny:latest", "stream": False})
        assert chat.status_code == 200 and chat.json()["model"] == "tiny:latest"
        ollama = client.post("/api/chat", json={"model": "tiny:latest", "messages": BODY["messages"], "stream": False,
                                                "options": {"num_predict": 2}})
        assert ollama.status_code == 200 and (ollama.json()["model"], ollama.json()["done"]) == ("tiny:latest", True)
        assert client.post("/api/show", json={"model": "tiny:latest"}).status_code == 200
        assert client.get("/v1/models/tiny:latest").json()["id"] == "tiny"
        assert client.get("/v1/models/other").status_code == 404
        missing = client.post("/api/chat", json={"model": "other:latest", "messages": BODY["messages"]})
        assert (missing.status_code, missing.json()) == (
            404, {"error": "The model 'other:latest' does not exist; this server serves: tiny"})
    assert check_model("tiny:latest", ["tiny", "tiny:latest"]) == "tiny:latest"  # a model named so is that one


def test_the_root_on_the_ollama_port_answers_as_ollama_does(app_state: ServerState) -> None:
    """Apps find an Ollama server by `GET /` saying so; the main port keeps the web chat."""
    app_state.ollama_port = 11434
    with TestClient(create_app(app_state), base_url="http://127.0.0.1:11434") as client:
        assert (client.get("/").text, client.head("/").status_code) == ("Ollama is running", 200)
        assert client.get("http://127.0.0.1:8080/").headers["content-type"].startswith("text/html")
