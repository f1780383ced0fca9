"""RPC workers' addresses as --rpc and `runner rpc-worker` take them (HOST:PORT, IPv6 as
[ADDR]:PORT): plain parsing, so the router checks them without loading llama.cpp."""

from __future__ import annotations

import re
from dataclasses import dataclass

from runner.core.errors import OptionError

DEFAULT_PORT = 50052


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    @property
    def text(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        return self.host in ("localhost", "::1") or self.host.startswith("127.")


def parse_endpoint(text: str, default_port: int | None = None) -> Endpoint:
    """HOST:PORT (IPv6 as [ADDR]:PORT); the port may be left out where there is a default."""
    match = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d+))?|([A-Za-z0-9.\-]+)(?::(\d+))?", text.strip())
    host = match and (match[1] or match[3])
    port_text = match and (match[2] or match[4])
    port = int(port_text) if port_text else default_port
    if not host or port is None or not 0 < port < 65536:
        raise OptionError(f"not an RPC worker address: {text!r} (expected HOST:PORT, e.g. 192.168.1.20:{DEFAULT_PORT})")
    return Endpoint(host, port)


def parse_workers(text: str) -> list[Endpoint]:
    """--rpc's HOST:PORT[,HOST:PORT...] (each once)."""
    endpoints = [parse_endpoint(part) for part in text.split(",")]
    if len(set(endpoints)) != len(endpoints):
        raise OptionError(f"--rpc names a worker twice: {text!r}")
    return endpoints
