"""RPC workers' addresses as --rpc and `runner rpc-worker` take them (HOST:PORT; IPv4 or a name:
ggml-rpc splits at the first colon and listens with inet_addr): plain parsing, so the router checks
them without loading llama.cpp."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass

from runner.core.errors import OptionError

DEFAULT_PORT = 50052


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    @property
    def text(self) -> str:
        return f"{self.host}:{self.port}"

    def resolved(self) -> Endpoint:
        """With the host as an IPv4 address (ggml-rpc takes no names; OSError when it cannot be resolved)."""
        return Endpoint(socket.gethostbyname(self.host), self.port)

    @property
    def is_loopback(self) -> bool:
        return self.host == "localhost" or self.host.startswith("127.")


def parse_endpoint(text: str, default_port: int | None = None) -> Endpoint:
    """HOST:PORT (IPv4 or a name); the port may be left out where there is a default."""
    if text.strip().startswith("[") or text.count(":") > 1:
        raise OptionError(f"{text!r}: llama.cpp's RPC speaks IPv4 only; give an IPv4 address or a host name")
    match = re.fullmatch(r"([A-Za-z0-9.\-]+)(?::(\d+))?", text.strip())
    host = match and match[1]
    port_text = match and match[2]
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
