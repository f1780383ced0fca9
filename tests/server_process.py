"""Start a real `runner serve` on 127.0.0.1 (a free port) as a subprocess, for integration tests."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from collections.abc import Callable
from typing import Iterator

import httpx
import openai

URL_LINE = re.compile(r"on (http://127\.0\.0\.1:\d+)")
# How long a request may take before a test calls the server hung: a deadline against hangs, never a
# speed check. A router's first request for a model loads it (and calibrates --spec auto); on a fully
# loaded 2-core machine that took over 60 s once.
HANG_S = 300


class ServerProcess:
    def __init__(self, model: str, cache: Path, *args: str, models: tuple[str, ...] | None = None) -> None:
        """`runner serve MODEL` (or MODELS: a router; `model` is then what requests name by default)."""
        self.model = model
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runner", "serve", *(models if models is not None else (model,)), "--port", "0",
             "--host", "127.0.0.1", *args],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
            env={**os.environ, "RUNNER_CACHE_DIR": str(cache)},
        )
        self.url = self._wait_for_url()
        # the server's log is read on from here (a full pipe would block the server), its tail kept
        self.log_tail: deque[str] = deque(maxlen=200)
        self._drain = threading.Thread(target=self._drain_log, daemon=True)
        self._drain.start()

    def _drain_log(self) -> None:
        assert self.proc.stderr is not None
        with self.proc.stderr:
            for line in self.proc.stderr:
                self.log_tail.append(line)

    def _wait_for_url(self, timeout_s: float = HANG_S) -> str:
        deadline = time.time() + timeout_s
        assert self.proc.stderr is not None
        seen = []
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                raise RuntimeError("server exited: " + "".join(seen))
            seen.append(line)
            match = URL_LINE.search(line)
            if match:
                return match.group(1)
        raise RuntimeError("server did not start: " + "".join(seen))

    def openai_client(self, api_key: str = "unused") -> openai.OpenAI:
        """The official client on this server, validating every response strictly (close it, or use `with`)."""
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, _strict_response_validation=True,
                             max_retries=0)

    def get(self, path: str, **kw: object) -> httpx.Response:
        with self.explained():
            return httpx.get(self.url + path, timeout=HANG_S, **kw)

    def post(self, path: str, **kw: object) -> httpx.Response:
        """POST; a JSON body for the API names the served model unless it says otherwise (`"model": None`
        sends none)."""
        with self.explained():
            return httpx.post(self.url + path, timeout=HANG_S, **self.with_model(path, kw))

    @contextlib.contextmanager
    def explained(self) -> Iterator[None]:
        """A refused connection because the server has ended says how it ended, with its log's tail."""
        try:
            yield
        except httpx.ConnectError:
            code = self.proc.poll()
            if code is None:
                raise
            raise RuntimeError(f"the server had ended (exit code {code}); its log ends:\n"
                               + "".join(list(self.log_tail)[-40:])) from None

    def with_model(self, path: str, kw: dict) -> dict:
        body = kw.get("json")
        if path.startswith("/v1/") and isinstance(body, dict) and "model" not in body:
            kw = {**kw, "json": {"model": self.model, **body}}
        return kw

    def wait_all_idle(self, timeout_s: float = 10, headers: dict[str, str] | None = None) -> list[dict]:
        deadline = time.time() + timeout_s
        while True:
            slots = self.get("/slots", headers=headers or {}).json()
            if all(s["state"] == "idle" for s in slots) or time.time() > deadline:
                return slots
            time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._drain.join(timeout=10)


def wait_for(condition: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    """Poll condition() until it holds or timeout_s passes (a bound on a hang, not a speed check)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
