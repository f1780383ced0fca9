"""One model served by its own `runner serve` process on a private Unix socket: the router's unit
of loading, unloading and containment (a native abort ends that process, not the router)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path

from runner.catalog.embedded import is_frozen
from runner.config.options import to_flags
from runner.router.servable import ServableModel
from runner.router.upstream import Upstream, UpstreamError

READY_MARK = "runner: serving "
ERROR_MARK = "runner: error: "
STOP_GRACE_S = 10.0  # after SIGTERM, then SIGKILL


_SOURCE_PATH = re.compile(r"^\S+\.(?:c|cpp|h):\d+: ")  # how ggml's aborts begin
UNAVAILABLE_EXIT = 75  # EX_TEMPFAIL: the model process could not reach what it needs (an RPC worker)


class LoadFailed(Exception):
    """The model process ended before it served: the reason in one sentence."""

    def __init__(self, reason: str, unavailable: bool = False) -> None:
        super().__init__(reason)
        self.unavailable = unavailable


def runner_command() -> list[str]:
    """How to start runner again: the one-file executable is itself the command."""
    return [sys.executable] if is_frozen() else [sys.executable, "-m", "runner"]


class ModelProcess:
    def __init__(self, model: ServableModel, socket_path: Path, serve_flags: list[str],
                 log: Callable[[str], None]) -> None:
        self.model = model
        self.socket_path = socket_path
        self._serve_flags = serve_flags
        self._log = log
        self._proc: asyncio.subprocess.Process | None = None
        self._tail: deque[str] = deque(maxlen=20)
        self._reader: asyncio.Task[None] | None = None
        self.n_threads = model.options.threads
        self.upstream = Upstream(socket_path)

    def command(self) -> list[str]:
        aliases = [flag for alias in self.model.ids for flag in ("--alias", alias)]
        return [*runner_command(), "serve", self.model.source, "--uds", str(self.socket_path), "--model-process",
                *aliases, *self._serve_flags, *to_flags(self.model.options)]

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def start(self) -> None:
        """Start the process and return once it serves; LoadFailed with its reason if it ends first."""
        env = {k: v for k, v in os.environ.items() if k != "RUNNER_API_KEY"}  # the socket is private; no key
        env.setdefault("GGML_NO_BACKTRACE", "1")  # an abort's reason is its last line, not a debugger's stack dump
        self._proc = await asyncio.create_subprocess_exec(
            *self.command(), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True)  # Ctrl-C reaches the router only; stdin's end tells it the router is gone
        ready = asyncio.get_running_loop().create_future()
        self._reader = asyncio.create_task(self._read_log(ready))
        try:
            await ready
        except BaseException:
            await self.stop()
            raise

    async def _read_log(self, ready: asyncio.Future[None]) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        async for raw in self._proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            if not line:
                continue
            self._tail.append(line)
            if line.startswith(READY_MARK) and not ready.done():
                ready.set_result(None)
            elif not line.startswith(READY_MARK):
                self._log(f"[{self.model.name}] {line}")
        code = await self._proc.wait()
        if not ready.done():
            ready.set_exception(LoadFailed(self.failure_reason(), unavailable=code == UNAVAILABLE_EXIT))

    def failure_reason(self) -> str:
        """The process's own one-line error, else its last words and how it ended."""
        code = self._proc.returncode if self._proc is not None else None
        for line in reversed(self._tail):
            if line.startswith(ERROR_MARK):
                return line.removeprefix(ERROR_MARK)
        how = f"exit status {code}" if code is None or code >= 0 else f"signal {signal.Signals(-code).name}"
        # (its "serving" line is not last words: a process killed while serving said nothing more)
        said = self._tail[-1] if self._tail and not self._tail[-1].startswith(READY_MARK) else None
        last = ": " + _SOURCE_PATH.sub("", said) if said is not None else ""
        return f"the model process for '{self.model.name}' ended ({how}){last}"

    async def set_threads(self, n_threads: int) -> None:
        """The process's decode threads from its next step (the router shares the cores)."""
        if n_threads != self.n_threads and self.is_alive:
            self.n_threads = n_threads
            body = b'{"threads": %d}' % n_threads
            with contextlib.suppress(UpstreamError):  # a process that just ended has no threads to set
                response = await self.upstream.request("POST", "/model-process/threads",
                                                       [("content-type", "application/json")], body)
                await response.read()
                await response.close()

    def terminate(self) -> None:
        """SIGTERM now, without waiting (the router is shutting down: stop() follows)."""
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.terminate()

    async def stop(self) -> None:
        """SIGTERM (in-flight requests are cancelled), then SIGKILL after a grace period."""
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if self._reader is not None:
            with contextlib.suppress(BaseException):
                await self._reader
        self.upstream.close()
        with contextlib.suppress(OSError):
            self.socket_path.unlink()
