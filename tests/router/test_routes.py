"""The router's own answers, in-process on a pool that loads nothing (the real processes: test_router.py)."""

from __future__ import annotations

from pathlib import Path

from starlette.testclient import TestClient

from runner.catalog.store import ModelStore
from runner.config.options import EngineOptions
from runner.router.app import create_router_app
from runner.router.model_pool import ModelPool
from runner.router.servable import ServableModel
from runner.router.state import RouterState


def idle_router(models: list[ServableModel], store: ModelStore) -> RouterState:
    def spawn(model: ServableModel):  # type: ignore[no-untyped-def]
        raise AssertionError(f"nothing should load ({model.name})")

    async def plan_bytes(model: ServableModel) -> int:
        raise AssertionError(f"nothing should load ({model.name})")

    return RouterState(ModelPool(models, spawn, plan_bytes, keep_alive_s=1800.0), preload=False, store=store)


def test_v1_models_says_what_a_catalog_model_not_pulled_yet_takes(tmp_path: Path, tiny_gguf: Path) -> None:
    """(A catalog vision model not cached yet was listed as taking text alone.)"""
    names = ["smolvlm-256m-instruct", "smolvlm-500m-instruct", "smollm2-135m-instruct", "hf.co/org/repo-GGUF:Q8_0"]
    models = [ServableModel(name, name, EngineOptions()) for name in names]
    state = idle_router([*models, ServableModel("tiny", str(tiny_gguf), EngineOptions())],
                        ModelStore(root=tmp_path / "empty-cache"))
    with TestClient(create_router_app(state, log=lambda _: None), base_url="http://127.0.0.1") as client:
        listed = {m["id"]: m["inputs"] for m in client.get("/v1/models").json()["data"]}
    assert listed == {"smolvlm-256m-instruct": ["text", "image"], "smolvlm-500m-instruct": ["text", "image"],
                      "smollm2-135m-instruct": ["text"], "hf.co/org/repo-GGUF:Q8_0": ["text"], "tiny": ["text"]}


def test_the_root_on_the_ollama_port_answers_as_ollama_does(tmp_path: Path, tiny_gguf: Path) -> None:
    """Apps find an Ollama server by `GET /` saying so; the main port keeps the web chat."""
    state = idle_router([ServableModel("tiny", str(tiny_gguf), EngineOptions())], ModelStore(root=tmp_path))
    state.ollama_port = 11434
    with TestClient(create_router_app(state, log=lambda _: None), base_url="http://127.0.0.1:11434") as client:
        root = client.get("/")
        assert (root.status_code, root.text, root.headers["content-type"]) == (200, "Ollama is running",
                                                                               "text/plain; charset=utf-8")
        assert client.get("http://127.0.0.1:8080/").headers["content-type"].startswith("text/html")


def test_an_embed_with_keep_alive_0_is_passed_on_not_read_as_an_unload(tmp_path: Path, tiny_gguf: Path) -> None:
    """Ollama's empty-request unload is chat's and generate's: an embed (its text under `input`)
    was answered "unload" with no embeddings. Here it goes on to its model (whose load this pool
    refuses: the request reached it)."""
    state = idle_router([ServableModel("tiny", str(tiny_gguf), EngineOptions())], ModelStore(root=tmp_path))
    with TestClient(create_router_app(state, log=lambda _: None), base_url="http://127.0.0.1",
                    raise_server_exceptions=False) as client:
        embed = client.post("/api/embed", json={"model": "tiny", "input": ["hello"], "keep_alive": 0})
        unload = client.post("/api/generate", json={"model": "tiny", "keep_alive": 0})
    assert embed.status_code == 500 and "done_reason" not in embed.text
    assert (unload.status_code, unload.json()["done_reason"]) == (200, "unload")
