"""Embeddings: on the tiny model (packing, normalization, limits), then `/v1/embeddings` on a real
server (SmolLM2: mean-pooled, L2-normalized last hidden states) beside a streaming chat."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from engines import load_tiny
from runner.runtime.embeddings import MAX_INPUTS_PER_DECODE, InputTooLongError
from server_process import ServerProcess
from tiny_gguf import write_tiny_gguf

MODEL = "smollm2-135m-instruct"


def test_vectors_are_unit_length_and_do_not_depend_on_their_batch(tiny_gguf: Path) -> None:
    loaded = load_tiny(tiny_gguf, 1, ctx_size=128)
    try:
        embedder = loaded.embedder()
        assert embedder.dimensions == 64 and embedder.pooling == "mean"
        inputs = [[(7 * i + j) % 250 + 3 for j in range(3 + i % 5)] for i in range(MAX_INPUTS_PER_DECODE + 8)]
        together = embedder.embed(inputs)  # two decodes: 32 inputs, then 8
        assert together.shape == (len(inputs), 64)
        np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)
        alone = np.stack([embedder.embed([ids])[0] for ids in inputs[::9]])
        # the same vectors whatever else shares the decode (up to float rounding of other batch shapes)
        assert np.all(np.sum(alone * together[::9], axis=1) > 0.9999)
        assert embedder.embed([inputs[0], inputs[0]])[1] @ together[0] > 0.9999
        with pytest.raises(InputTooLongError, match="input 1 has 129 tokens; an embedding input holds at most 128"):
            embedder.embed([[5], [5] * 129])
        assert loaded.engine.scheduler.pool.n_busy == 0  # no slot was involved
    finally:
        loaded.close()


def test_an_embedding_model_is_pooled_as_its_gguf_says(tmp_path: Path) -> None:
    """CLS pooling (the GGUF's llama.pooling_type 2) on a causal model: a text's vector is its first
    token's hidden state, whatever follows it."""
    path = write_tiny_gguf(tmp_path / "cls.gguf", pooling_type=2)
    loaded = load_tiny(path, 1, ctx_size=64)
    try:
        embedder = loaded.embedder()
        assert embedder.pooling == "model"
        first, longer, other = embedder.embed([[40], [40, 41, 42, 43], [41, 42, 43]])
        assert first @ longer > 0.9999 and first @ other < 0.999
    finally:
        loaded.close()


def test_an_embedding_model_embeds_and_refuses_to_write_a_reply(tmp_path: Path) -> None:
    """(it answered chat with noise: its GGUF names a pooling type, as Ollama tells embedding models)"""
    from engines import in_process_server
    from runner.core.errors import InputError
    from runner.python_api.runner import Runner

    path = write_tiny_gguf(tmp_path / "embedder.gguf", pooling_type=1)
    with in_process_server(load_tiny(path, 1, ctx_size=64)) as client:
        assert client.post("/v1/embeddings", json={"model": "tiny", "input": "hi"}).status_code == 200
        for route, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                            ("/v1/completions", {"prompt": "hi"}), ("/api/generate", {"prompt": "hi"}),
                            ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})):
            r = client.post(route, json={"model": "tiny", **body})
            assert r.status_code == 400, (route, r.text)
            assert "this is an embedding model (its GGUF names a pooling type)" in r.text, route
    runner = Runner(str(path), ctx_size=64)
    try:
        assert runner.embed(["hi"]).shape == (1, 64)
        with pytest.raises(InputError, match="embedding model"):
            runner.complete("hi", max_tokens=2)
    finally:
        runner.close()
    proc = subprocess.run([sys.executable, "-m", "runner", "run", str(path), "-p", "hi", "-q"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1 and proc.stderr.startswith("runner: error: this is an embedding model")


@pytest.fixture(scope="module")
def server(serve_smollm2: Callable[..., ServerProcess]) -> ServerProcess:
    return serve_smollm2("--parallel", "2", "--ctx-size", "256")


def _embed(server: ServerProcess, **body: object) -> httpx.Response:
    return server.post("/v1/embeddings", json={"model": MODEL, **body})


@pytest.mark.model
def test_embeddings_over_http(server: ServerProcess) -> None:
    texts = ["The cat sat on the mat.", "A cat was sitting on the rug.", "Stock markets fell sharply today."]
    r = _embed(server, input=texts)
    assert r.status_code == 200, r.text
    body = r.json()
    assert [d["index"] for d in body["data"]] == [0, 1, 2] and body["object"] == "list"
    vectors = np.array([d["embedding"] for d in body["data"]])
    assert vectors.shape == (3, 576)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    similar, unrelated = vectors[0] @ vectors[1], vectors[0] @ vectors[2]
    assert similar > unrelated + 0.05
    again = np.array(_embed(server, input=texts[0]).json()["data"][0]["embedding"])
    assert again @ vectors[0] == pytest.approx(1.0, abs=1e-5)
    packed = _embed(server, input=texts[0], encoding_format="base64").json()["data"][0]["embedding"]
    np.testing.assert_allclose(np.frombuffer(base64.b64decode(packed), dtype="<f4"), again, atol=1e-6)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 10


@pytest.mark.model
def test_many_inputs_and_token_ids_with_the_sdk(server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)  # (it asks for base64)
    texts = [f"Sentence number {i} about topic {i % 4}." for i in range(32)]
    many = client.embeddings.create(model=MODEL, input=texts)
    assert len(many.data) == 32 and len(many.data[5].embedding) == 576
    ids = [[504, 3165, 1456], [2, 3, 4, 5]]
    by_ids = client.embeddings.create(model=MODEL, input=ids, encoding_format="float")
    assert [len(d.embedding) for d in by_ids.data] == [576, 576] and by_ids.usage.prompt_tokens == 7
    client.close()


@pytest.mark.model
def test_embeddings_take_no_slot_from_a_streaming_chat(server: ServerProcess) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell a long story."}], "stream": True,
            "max_tokens": 200, "ignore_eos": True, "temperature": 0}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as stream:
        lines = stream.iter_lines()
        next(line for line in lines if line.startswith("data: {"))  # the chat is streaming

        def busy() -> list[int]:
            return [s["id"] for s in server.get("/slots").json() if s["state"] != "idle"]

        busy_before = busy()
        r = _embed(server, input=["while the chat streams"] * 4)
        assert r.status_code == 200 and len(r.json()["data"]) == 4
        assert busy() == busy_before and len(busy_before) == 1  # the chat's slot only
        chunks_after = [line for line in lines if line.startswith("data: {")]
    assert chunks_after and '"finish_reason": "length"' in chunks_after[-1]  # the chat went on to its end


@pytest.mark.model
@pytest.mark.parametrize(("body", "param"), [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": ["ok", 5]}, "input"),
    ({"input": "x", "dimensions": 64}, "dimensions"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "word " * 400}, "input"),  # over the 256-token context
    ({"input": [[999999]]}, "input"),
])
def test_bad_embedding_input_names_the_field(server: ServerProcess, body: dict, param: str) -> None:
    r = _embed(server, **body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.mark.model
def test_runner_embed_prints_one_vector_per_line(cache_env: Path, smollm2_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "runner", "embed", MODEL, "hello world", "good night", "-q"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    vectors = np.array([json.loads(line) for line in proc.stdout.splitlines()])
    assert vectors.shape == (2, 576)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
