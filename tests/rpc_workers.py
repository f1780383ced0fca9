"""`runner rpc-worker` processes on 127.0.0.1 for the RPC tests (never another address)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from runner.runtime.rpc import RpcError, hello
from runner.runtime.rpc_address import Endpoint


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Worker:
    def __init__(self, port: int | None = None, cache_dir: Path | None = None) -> None:
        self.port = port or free_port()
        self.cache_dir = cache_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        cache = ["--cache-dir", str(self.cache_dir)] if self.cache_dir else []
        self.proc = subprocess.Popen([sys.executable, "-m", "runner", "rpc-worker", "--port", str(self.port), *cache],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while True:
            try:
                hello(Endpoint("127.0.0.1", self.port), timeout_s=10)
                return
            except RpcError:
                if self.proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"rpc-worker on port {self.port} did not start") from None
                time.sleep(0.1)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
