"""`runner serve`: load the model, start the engine thread, run uvicorn."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from typing import TYPE_CHECKING

from runner.config.options import PORT, EngineOptions, add_flags, from_args
from runner.core.errors import RunnerError
from runner.server.guards import DEFAULT_MAX_BODY_BYTES, HostPolicy
from runner.server.reasoning import FORMATS

if TYPE_CHECKING:
    import uvicorn

DEFAULT_PORT = 8080
SWITCH_INTERVAL_S = 0.0005
DEFAULT_STREAM_INTERVAL_MS = 50.0
SHUTDOWN_GRACE_S = 3  # after SIGTERM/Ctrl-C: in-flight requests are cancelled, connections get this long to close
API_KEY_ENV = "RUNNER_API_KEY"


def uvicorn_logging(args: argparse.Namespace) -> dict[str, object]:
    """Warnings only; with --log-requests, a line per request too."""
    logs = getattr(args, "log_requests", False)
    return {"log_level": "info" if logs else "warning", "access_log": logs}


def add_serve_flags(p: argparse.ArgumentParser) -> None:
    """`runner serve`'s own flags and the engine's (the model argument and --quiet are the CLI's)."""
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=PORT, default=DEFAULT_PORT, help=f"port (default: {DEFAULT_PORT}; 0 picks a free one)")
    p.add_argument("--api-key", default=None,
                   help=f"require 'Authorization: Bearer KEY' on the API (visible in ps: prefer ${API_KEY_ENV} "
                        "or --api-key-file)")
    p.add_argument("--api-key-file", type=Path, default=None, metavar="PATH",
                   help="read the API key from this file's first line")
    p.add_argument("--allowed-hosts", default="", metavar="NAMES",
                   help="comma-separated host names the server answers to besides IP addresses, localhost and "
                        "this machine's name ('*': any); other Host headers get 403 (DNS rebinding protection)")
    p.add_argument("--cors-origins", default="", metavar="ORIGINS",
                   help="comma-separated web origins (e.g. https://app.example) whose pages may call the API; "
                        "default none: only the built-in page and programs")
    p.add_argument("--reasoning-format", choices=FORMATS, default=FORMATS[0],
                   help="a reply that opens with <think>...</think> (reasoning models): deepseek: that part as "
                        "message.reasoning_content (streamed as delta.reasoning_content); none: kept inline in the "
                        f"content (default: {FORMATS[0]})")
    p.add_argument("--max-body-mb", type=float, default=DEFAULT_MAX_BODY_BYTES / 1e6, metavar="MB",
                   help="largest request body; larger ones get 413 before they are read "
                        f"(default: {DEFAULT_MAX_BODY_BYTES / 1e6:g})")
    p.add_argument("--allow-remote-media", action="store_true",
                   help="fetch images given as http(s) URLs (at most 20 MB, 10 s each); off by default: a server "
                        "that fetches what it is given can be made to reach machines only it can reach")
    p.add_argument("--alias", action="append", default=[],
                   help="another model id to answer to (repeatable; serving several: the first model's)")
    p.add_argument("--stream-interval", type=_milliseconds, default=DEFAULT_STREAM_INTERVAL_MS, metavar="MS",
                   help="streamed tokens reach the HTTP side at least this often, in batches; a reply's first "
                        "and last token at once; 0: every token as it is sampled, which costs the engine a "
                        f"thread wake-up per token (default: {DEFAULT_STREAM_INTERVAL_MS:g})")
    p.add_argument("--ollama-port", type=PORT, default=None, metavar="PORT",
                   help="also listen on this port (11434: Ollama's), for apps that cannot be told another")
    p.add_argument("--log-requests", action="store_true",
                   help="log each request on stderr: its client, method, path and status (uvicorn's access log)")
    p.add_argument("--uds", default=None, metavar="PATH", help=argparse.SUPPRESS)  # a model process's socket
    p.add_argument("--model-process", action="store_true", help=argparse.SUPPRESS)  # started by a router
    # started by `runner launch`: ends when launch does, however it ended (stdin's end, as a model process)
    p.add_argument("--with-parent", action="store_true", help=argparse.SUPPRESS)
    add_flags(p, EngineOptions)


def serve_flags_for_models(args: argparse.Namespace) -> list[str]:
    """The serve flags a router's model processes inherit (the HTTP-facing ones stay with the router)."""
    return ["--reasoning-format", args.reasoning_format, "--max-body-mb", str(args.max_body_mb),
            "--stream-interval", str(args.stream_interval)] + (["--quiet"] if args.quiet else []) + (
               ["--allow-remote-media"] if args.allow_remote_media else [])


def host_policy(args: argparse.Namespace) -> HostPolicy:
    return HostPolicy.for_server(args.host, _names(args.allowed_hosts))


def _milliseconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected 0 or more milliseconds, got {text!r}")
    return value


def _names(text: str) -> frozenset[str]:
    return frozenset(n.strip() for n in text.split(",") if n.strip())


def api_key(args: argparse.Namespace) -> str | None:
    """--api-key, else --api-key-file's first line, else $RUNNER_API_KEY (None: no key)."""
    if args.api_key:
        return args.api_key
    if args.api_key_file is not None:
        try:
            lines = args.api_key_file.read_text().splitlines()
        except OSError as exc:
            raise RunnerError(f"cannot read --api-key-file: {exc.strerror}: {args.api_key_file}") from None
        if not lines or not lines[0].strip():
            raise RunnerError(f"--api-key-file {args.api_key_file} is empty")
        return lines[0].strip()
    return os.environ.get(API_KEY_ENV) or None


def cmd_serve(args: argparse.Namespace, on_ready: Callable[[str], None] | None = None) -> int:
    """Serve until Ctrl-C or SIGTERM (in-flight work is cancelled); on_ready(url) runs once the port is bound."""
    import uvicorn

    from runner.model.loaded_model import LoadedModel
    from runner.server.app import create_app
    from runner.server.engine_thread import EngineThread
    from runner.server.state import ServerState
    from runner.server.uvicorn_server import CancellingServer

    if not args.max_body_mb > 0:
        raise RunnerError(f"--max-body-mb must be more than 0, got {args.max_body_mb:g}")
    key = api_key(args)

    # NOTE: the engine thread must get the GIL back the moment llama_decode returns; the default 5 ms
    # switch interval lets the HTTP thread hold it that long and leaves the cores idle meanwhile.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    log = (lambda _: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    sockets = listening_sockets(args)
    try:
        loaded = LoadedModel(args.model, from_args(EngineOptions, args), log=log)
    except BaseException:
        for sock in sockets or []:
            sock.close()
        raise
    engine_thread = EngineThread(loaded.engine, on_error=lambda exc: print(f"engine error: {exc!r}", file=sys.stderr))
    engine_thread.start()
    state = ServerState(loaded, engine_thread, [loaded.name, *args.alias], key,
                        stream_interval_s=args.stream_interval / 1000,
                        hosts=host_policy(args),
                        cors_origins=_names(args.cors_origins), max_body_bytes=int(args.max_body_mb * 1e6),
                        reasoning_format=args.reasoning_format, is_model_process=args.model_process,
                        allow_remote_media=args.allow_remote_media, ollama_port=ollama_port(sockets))
    where = {"uds": args.uds} if args.uds else {"host": args.host, "port": args.port}
    config = uvicorn.Config(create_app(state), **where, **uvicorn_logging(args), timeout_graceful_shutdown=SHUTDOWN_GRACE_S)
    server = CancellingServer(config, on_exit=engine_thread.cancel_all)
    print_ready(server, loaded.name, f" with {loaded.options.parallel} slots", on_ready)
    if args.model_process or args.with_parent:
        _exit_with_parent()
    try:
        server.run(sockets=sockets)
    finally:
        state.close()
    return 0


def ollama_port(sockets: list[socket.socket] | None) -> int | None:
    """The port --ollama-port listens on (as bound: 0 asks the system for one), if any."""
    return sockets[1].getsockname()[1] if sockets and len(sockets) == 2 else None


def listening_sockets(args: argparse.Namespace) -> list[socket.socket] | None:
    """The server's addresses (--port, and --ollama-port when given), bound before a model loads, so
    that a taken or bad address is said at once (None: a model process's Unix socket, bound by uvicorn)."""
    if args.uds:
        return None
    ports = [args.port] + ([args.ollama_port] if args.ollama_port is not None else [])
    if len(ports) == 2 and ports[0] == ports[1] != 0:
        raise RunnerError(f"--ollama-port {args.ollama_port} is --port too: give it a port of its own")
    bound: list[socket.socket] = []
    for port in ports:
        sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (as uvicorn binds)
        try:
            sock.bind((args.host, port))
        except OSError as exc:
            sock.close()
            for other in bound:
                other.close()
            raise RunnerError(f"cannot listen on {args.host}:{port}: {exc.strerror or exc}") from None
        sock.set_inheritable(True)
        bound.append(sock)
    return bound


def _exit_with_parent() -> None:
    """A model process ends when its router does (a launched server when `runner launch` does),
    however it ended: the parent holds the other end of our stdin, and the pipe's end-of-file
    arrives when the parent is gone."""
    import signal
    import threading

    def watch() -> None:
        sys.stdin.buffer.read()
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def print_ready(server: object, what: str, detail: str, on_ready: Callable[[str], None] | None) -> None:
    """Print the URL once uvicorn has bound (with --port 0 the port is only known then)."""
    original = server.startup  # type: ignore[attr-defined]

    async def startup(sockets: object = None) -> None:
        await original(sockets=sockets)
        for s in server.servers:  # type: ignore[attr-defined]
            for sock in s.sockets:
                name = sock.getsockname()
                url = f"unix:{name}" if isinstance(name, str) else f"http://{name[0]}:{name[1]}"
                print(f"runner: serving {what}{detail} on {url} (Ctrl-C to stop)", file=sys.stderr, flush=True)
                if on_ready is not None:
                    on_ready(url + "/")

    server.startup = startup  # type: ignore[attr-defined]
