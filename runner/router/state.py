"""What a router holds while it runs: the model pool and the settings every route reads."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from runner.catalog.store import ModelStore
from runner.config.options import EngineOptions
from runner.router.model_pool import ModelPool
from runner.router.servable import ServableModel
from runner.runtime.gguf_file import GgufInfo
from runner.server.guards import DEFAULT_MAX_BODY_BYTES, HostPolicy


@dataclass
class RouterState:
    pool: ModelPool
    api_key: str | None = None
    hosts: HostPolicy = field(default_factory=lambda: HostPolicy.for_server("127.0.0.1"))
    cors_origins: frozenset[str] = frozenset()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_n: int = 1  # the default options' slots: the most choices one request gets (for /openapi.json)
    slot_context: int = 0  # the default model's context per slot (/health, for `runner launch`)
    preload: bool = True  # load the default model at start
    created: int = field(default_factory=lambda: int(time.time()))
    # a servable model's GGUF header, read without loading it (None: its file is not here)
    describe: Callable[[ServableModel], GgufInfo | None] = lambda model: None
    store: ModelStore | None = None  # the cache /api/pull and /api/delete change
    ollama_port: int | None = None  # --ollama-port's, where `GET /` answers as Ollama does
    options: EngineOptions = field(default_factory=EngineOptions)  # for a model pulled while serving
