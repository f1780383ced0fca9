"""A real router on tiny random models (no real model needed): keep-alive, pins, Ollama's unload and
durations, and `name:latest`, as its clients see them."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_process import ServerProcess, wait_for

NEVER = "9999-12-31"  # how /api/ps writes a model kept loaded for as long as the server runs


@pytest.fixture(scope="module")
def router(tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Models a (pinned, loaded at start), b (also named c:latest) and c, each a copy of the tiny model."""
    root = tmp_path_factory.mktemp("tiny-router")
    paths = []
    for name in ("a", "b", "c"):
        path = root / f"{name}.gguf"
        path.write_bytes(tiny_gguf.read_bytes())
        paths.append(str(path))
    config = root / "models.toml"
    config.write_text('[models.b]\naliases = ["c:latest"]\n')
    server = ServerProcess("a", root / "cache", "--threads", "1", "--parallel", "1", "--ctx-size", "256",
                           "--keep-alive", "10m", "--pin", "a", "--models-config", str(config), models=tuple(paths))
    yield server
    server.stop()


def listed(server: ServerProcess) -> dict[str, dict]:
    return {m["id"]: m for m in server.get("/models").json()["data"]}


def state_of(server: ServerProcess, model: str) -> str:
    return listed(server)[model]["status"]["value"]



def generate(server: ServerProcess, model: str, **extra: object) -> httpx.Response:
    return server.post("/api/generate", json={"model": model, "prompt": "hello", "stream": False,
                                              "options": {"num_predict": 2, "temperature": 0}, **extra})


def expires_at(server: ServerProcess, model: str) -> str:
    ps = server.get("/api/ps")
    assert ps.status_code == 200, ps.text
    return {m["name"]: m["expires_at"] for m in ps.json()["models"]}[model]


def runner_ps(server: ServerProcess) -> dict[str, str]:
    """`runner ps`: each loaded model's UNLOADS IN."""
    port = server.url.rsplit(":", 1)[1]
    out = subprocess.run([sys.executable, "-m", "runner", "ps", "--port", port], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return {line.split()[0]: line.split()[-1] for line in out.stdout.splitlines()[1:]}


@pytest.mark.parametrize("keep_alive", [1e30, 3e11, "100000000h"])
def test_a_keep_alive_too_far_to_represent_is_forever(router: ServerProcess, keep_alive: object) -> None:
    """(/api/ps was a 500 until the model unloaded: 'timestamp out of range', 'year 11533 is out of range'.)"""
    assert generate(router, "b", keep_alive=keep_alive).status_code == 200
    assert expires_at(router, "b").startswith(NEVER)
    assert listed(router)["b"]["expires_in_s"] is None
    assert runner_ps(router)["b"] == "never"


def test_a_pinned_model_never_expires_and_unloads_only_when_a_request_asks(router: ServerProcess) -> None:
    """(The idle keep-alive unloaded it: only eviction kept pins.)"""
    assert generate(router, "a", keep_alive="5m").status_code == 200  # a duration: not for a pinned model
    model = listed(router)["a"]
    assert (model["pinned"], model["status"], model["expires_in_s"]) == (True, {"value": "loaded"}, None)
    assert expires_at(router, "a").startswith(NEVER)
    assert runner_ps(router)["a"] == "never"
    unloaded = router.post("/api/generate", json={"model": "a", "keep_alive": 0})
    assert unloaded.status_code == 200 and unloaded.json()["done_reason"] == "unload"
    assert wait_for(lambda: state_of(router, "a") == "unloaded")
    assert generate(router, "a").status_code == 200
    assert listed(router)["a"]["expires_in_s"] is None  # pinned again: the default is forever


@pytest.mark.parametrize("path", ["/api/generate", "/api/chat"])
def test_an_ollama_unload_sent_while_the_model_loads_unloads_it_once_loaded(router: ServerProcess, path: str) -> None:
    """(It answered done_reason "unload" and the model then stayed loaded for the default keep-alive.)"""
    assert router.post("/models/unload", json={"model": "c"}).status_code == 200
    loading = threading.Thread(target=lambda: router.post("/models/load", json={"model": "c"}))
    loading.start()
    try:
        assert wait_for(lambda: state_of(router, "c") == "loading")
        empty = {"messages": []} if path == "/api/chat" else {}
        reply = router.post(path, json={"model": "c", "keep_alive": 0, **empty})
        assert reply.status_code == 200 and reply.json()["done_reason"] == "unload"
    finally:
        loading.join()
    assert wait_for(lambda: state_of(router, "c") == "unloaded")
    loads = listed(router)["c"]["loads"]
    again = router.post(path, json={"model": "c", "keep_alive": 0, **empty})
    assert again.status_code == 200 and again.json()["done_reason"] == "unload"  # not loaded, so as to unload it
    assert (state_of(router, "c"), listed(router)["c"]["loads"]) == ("unloaded", loads)


def final_object(server: ServerProcess, path: str, stream: bool) -> dict:
    body = {"model": "b", "stream": stream, "options": {"num_predict": 2, "temperature": 0}}
    body |= {"messages": [{"role": "user", "content": "hello"}]} if path == "/api/chat" else {"prompt": "hello"}
    reply = server.post(path, json=body)
    assert reply.status_code == 200, reply.text
    return json.loads(reply.text.splitlines()[-1])


@pytest.mark.parametrize(("path", "stream"), [("/api/generate", False), ("/api/chat", True)])
def test_an_ollama_reply_that_waited_for_its_model_to_load_counts_the_load_in_its_durations(
        router: ServerProcess, path: str, stream: bool) -> None:
    """(load_duration was always 0, and total_duration left out the load the request waited for.)"""
    assert router.post("/models/unload", json={"model": "b"}).status_code == 200
    cold = final_object(router, path, stream)
    assert cold["done"] is True and cold["load_duration"] > 0
    assert cold["total_duration"] > cold["load_duration"]
    warm = final_object(router, path, stream)
    assert warm["load_duration"] == 0


def test_name_latest_names_the_model_unless_a_model_is_named_so(router: ServerProcess) -> None:
    """(`smol:latest` was a 404 though smol was served: in Ollama the two are the same model.)"""
    unloads = {model: router.post("/models/unload", json={"model": model}).json()["model"]
               for model in ("b:latest", "c:latest", "c")}
    assert unloads == {"b:latest": "b", "c:latest": "b", "c": "c"}  # c:latest is b's own alias
    reply = generate(router, "a:latest")
    assert reply.status_code == 200 and reply.json()["model"] == "a:latest"
    chat = router.post("/v1/chat/completions", json={"model": "a:latest", "max_tokens": 2,
                                                     "messages": [{"role": "user", "content": "hello"}]})
    assert chat.status_code == 200, chat.text
    shown = router.post("/api/show", json={"model": "a:latest"})
    assert shown.status_code == 200 and shown.json()["details"]["format"] == "gguf"
    assert router.get("/v1/models/a:latest").json()["id"] == "a"
    assert {s["model"] for s in router.get("/slots", params={"model": "a:latest"}).json()} == {"a"}
    missing = router.post("/api/generate", json={"model": "d:latest", "prompt": "hello"})
    assert missing.status_code == 404
    assert missing.json() == {"error": "The model 'd:latest' does not exist; this server serves: a, b, c:latest, c"}
