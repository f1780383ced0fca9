"""Fill in the middle (OpenAI's `suffix`, Ollama's `suffix`) on a tiny model whose vocabulary has a
code model's tags: the prompt is prefix-suffix-middle in the model's own tokens, and a model
without the tags refuses the parameter by name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from engines import load_tiny
from runner.prompt.infill import FimTokens, fill_in_the_middle
from runner.server.app import create_app
from runner.server.engine_thread import EngineThread
from runner.server.state import ServerState
from tiny_gguf import write_tiny_gguf

TAGS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")  # spelled as Qwen2.5-Coder's (llama.cpp finds them so)
GREEDY = {"model": "tiny", "max_tokens": 6, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def fim_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("fim") / "fim.gguf", extra_specials=TAGS)


def _client(path: Path) -> Iterator[tuple[TestClient, ServerState]]:
    loaded = load_tiny(path, 2)
    thread = EngineThread(loaded.engine)
    thread.start()
    state = ServerState(loaded, thread, ["tiny"])
    with TestClient(create_app(state), base_url="http://127.0.0.1") as client:
        yield client, state


@pytest.fixture(scope="module")
def fim(fim_gguf: Path) -> Iterator[tuple[TestClient, ServerState]]:
    yield from _client(fim_gguf)


@pytest.fixture(scope="module")
def plain(tiny_gguf: Path) -> Iterator[tuple[TestClient, ServerState]]:
    yield from _client(tiny_gguf)


def test_the_prompt_is_prefix_suffix_middle_in_the_models_own_tags(fim: tuple[TestClient, ServerState]) -> None:
    _, state = fim
    model = state.loaded.model
    tags = [model.tokenize(t, add_special=False, parse_special=True) for t in TAGS]
    assert all(len(t) == 1 for t in tags) and model.fim_ids == tuple(t[0] for t in tags)
    assert state.facts.fills_in_the_middle
    before, after = model.tokenize("def f(", add_special=False), model.tokenize("):\n    return", add_special=False)
    assert state.loaded.infill_prompt_ids("def f(", "):\n    return") == (tags[0][0], *before, tags[1][0], *after,
                                                                         tags[2][0])
    assert fill_in_the_middle(FimTokens(7, 8, 9), (1,), (2, 3), bos_id=0) == (0, 7, 1, 8, 2, 3, 9)


def test_a_completion_with_a_suffix_decodes_the_fim_prompt(fim: tuple[TestClient, ServerState]) -> None:
    client, state = fim
    ids = state.loaded.infill_prompt_ids("x = [1, 2", "]\nprint(x)")
    by_ids = client.post("/v1/completions", json={"prompt": list(ids), **GREEDY}).json()
    infill = client.post("/v1/completions", json={"prompt": "x = [1, 2", "suffix": "]\nprint(x)", **GREEDY})
    assert infill.status_code == 200, infill.text
    assert infill.json()["choices"][0]["text"] == by_ids["choices"][0]["text"]
    assert infill.json()["usage"]["prompt_tokens"] == len(ids)
    ollama = client.post("/api/generate", json={"prompt": "x = [1, 2", "suffix": "]\nprint(x)", "stream": False,
                                                "model": "tiny", "options": {"num_predict": 6, "temperature": 0}})
    assert ollama.status_code == 200, ollama.text
    no_ignore_eos = {k: v for k, v in GREEDY.items() if k != "ignore_eos"}
    expected = client.post("/v1/completions", json={"prompt": list(ids), **no_ignore_eos}).json()["choices"][0]["text"]
    assert ollama.json()["response"] == expected
    batch = client.post("/v1/completions", json={"prompt": ["a", "b"], "suffix": "c", **GREEDY}).json()
    assert batch["usage"]["prompt_tokens"] == sum(len(state.loaded.infill_prompt_ids(p, "c")) for p in "ab")


def test_suffix_is_refused_by_name_where_it_cannot_be_done(fim: tuple[TestClient, ServerState],
                                                           plain: tuple[TestClient, ServerState]) -> None:
    no_tags = plain[0].post("/v1/completions", json={"prompt": "a", "suffix": "b", **GREEDY})
    assert no_tags.status_code == 400 and no_tags.json()["error"]["param"] == "suffix"
    assert "no fill-in-the-middle tokens" in no_tags.json()["error"]["message"]
    ollama = plain[0].post("/api/generate", json={"model": "tiny", "prompt": "a", "suffix": "b", "stream": False})
    assert ollama.status_code == 400 and "fill-in-the-middle" in ollama.json()["error"]
    client = fim[0]
    chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"}], "suffix": "b",
                                                     **GREEDY})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "suffix"
    echo = client.post("/v1/completions", json={"prompt": "a", "suffix": "b", "echo": True, **GREEDY})
    assert echo.status_code == 400 and echo.json()["error"]["param"] == "echo"
    templated = client.post("/api/generate", json={"model": "tiny", "prompt": "a", "suffix": "b",
                                                   "template": "{{ .Prompt }}"})
    assert templated.status_code == 400
