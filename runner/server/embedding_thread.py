"""Embeddings on a thread of their own, beside the engine's: requests that arrive together are
embedded together (one decode fits many inputs), and none waits behind a generation step."""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from runner.runtime.embeddings import Embedder


@dataclass
class _Job:
    inputs: list[list[int]]
    future: Future[np.ndarray]


class EmbeddingThread:
    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self._jobs: deque[_Job] = deque()
        self._wake = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="runner-embeddings", daemon=True)
        self._thread.start()

    @property
    def n_ctx(self) -> int:
        """The most tokens one input may have."""
        return self.embedder.n_ctx

    def submit(self, inputs: list[list[int]]) -> Future[np.ndarray]:
        self.embedder.check(inputs)  # InputTooLongError before anything is queued
        job = _Job(inputs, Future())
        with self._wake:
            if self._stopping:
                raise RuntimeError("the server is shutting down")
            self._jobs.append(job)
            self._wake.notify()
        return job.future

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._jobs and not self._stopping:
                    self._wake.wait()
                if self._stopping:
                    for job in self._jobs:
                        job.future.set_exception(RuntimeError("the server is shutting down"))
                    return
                jobs = list(self._jobs)
                self._jobs.clear()
            try:
                vectors = self.embedder.embed([ids for job in jobs for ids in job.inputs])
            except Exception as exc:  # noqa: BLE001 - each waiting request gets the error
                for job in jobs:
                    job.future.set_exception(exc)
                continue
            start = 0
            for job in jobs:
                job.future.set_result(vectors[start : start + len(job.inputs)])
                start += len(job.inputs)
