"""What the server holds while it runs: the model, its engine thread, and the settings every
route reads. Built by serve.py (or a test), handed to create_app and to every route handler."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

from runner.model.loaded_model import LoadedModel
from runner.model.model_facts import ModelFacts
from runner.server.embedding_thread import EmbeddingThread
from runner.server.engine_thread import EngineThread
from runner.server.event_pump import EventPump
from runner.server.guards import DEFAULT_MAX_BODY_BYTES, HostPolicy
from runner.server.reasoning import CLOSE as REASONING_CLOSE
from runner.server.reasoning import OPEN as REASONING_OPEN


@dataclass
class ServerState:
    loaded: LoadedModel
    engine_thread: EngineThread
    model_ids: list[str]  # the served name first, then its aliases
    api_key: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    stream_interval_s: float = 0.0  # see EventPump
    reasoning_format: str = "deepseek"  # reasoning.FORMATS: <think>…</think> as reasoning_content, or inline
    hosts: HostPolicy = field(default_factory=lambda: HostPolicy.for_server("127.0.0.1"))
    cors_origins: frozenset[str] = frozenset()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    is_model_process: bool = False  # started by a router, which may set its threads
    allow_remote_media: bool = False  # fetch http(s) image URLs (server.images.fetch)
    ollama_port: int | None = None  # --ollama-port's, where `GET /` answers as Ollama does
    is_closed: bool = False
    _pump: EventPump | None = None
    _embeddings: EmbeddingThread | None = None
    _embeddings_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.model_ids = list(dict.fromkeys(self.model_ids))  # (an alias that is the served name: listed once)
        # what the routes may know of the model (not loaded.model, loaded.template or the engine)
        self.facts: ModelFacts = self.loaded.facts
        # a reasoning model's <think> token, if it has one and the server splits reasoning off
        self.think_id = self.facts.single_token_id(REASONING_OPEN) if self.reasoning_format != "none" else None
        # its </think> token, where that is one token too: what a thinking budget ends the thought with
        self.think_close_id = self.facts.single_token_id(REASONING_CLOSE) if self.think_id is not None else None

    @property
    def served_name(self) -> str:
        return self.model_ids[0]

    def embedding_thread(self) -> EmbeddingThread:
        """Made on the first embeddings request (the context costs a slot's KV; most servers never embed)."""
        with self._embeddings_lock:
            if self._embeddings is None:
                self._embeddings = EmbeddingThread(self.loaded.embedder())
            return self._embeddings

    def event_pump(self) -> EventPump:
        if self._pump is None:  # created lazily: it needs the running loop
            self._pump = EventPump(asyncio.get_running_loop(), self.stream_interval_s)
        return self._pump

    def close(self) -> None:
        """Stop the engine thread, then free the model (idempotent: lifespan and CLI both call it)."""
        if not self.is_closed:
            self.is_closed = True
            self.engine_thread.stop()
            with self._embeddings_lock:
                if self._embeddings is not None:
                    self._embeddings.stop()
            self.loaded.close()
