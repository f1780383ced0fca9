"""`runner serve`: load the model, start the engine thread, run uvicorn."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from runner.options import EngineOptions, add_flags, from_args

DEFAULT_PORT = 8080
SWITCH_INTERVAL_S = 0.0005
DEFAULT_STREAM_INTERVAL_MS = 20.0


def add_serve_flags(p: argparse.ArgumentParser) -> None:
    """`runner serve`'s own flags and the engine's (the model argument and --quiet are the CLI's)."""
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default: {DEFAULT_PORT}; 0 picks a free one)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on the API")
    p.add_argument("--alias", action="append", default=[], help="another model id to answer to (repeatable)")
    p.add_argument("--stream-interval", type=_milliseconds, default=DEFAULT_STREAM_INTERVAL_MS, metavar="MS",
                   help="streamed tokens reach the HTTP side at least this often, in batches; a reply's first "
                        "and last token at once; 0: every token as it is sampled, which costs the engine a "
                        f"thread wake-up per token (default: {DEFAULT_STREAM_INTERVAL_MS:g})")
    add_flags(p, EngineOptions)


def _milliseconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected 0 or more milliseconds, got {text!r}")
    return value


def cmd_serve(args: argparse.Namespace, on_ready: Callable[[str], None] | None = None) -> int:
    """Serve until Ctrl-C or SIGTERM; on_ready(url) runs once the port is bound."""
    import uvicorn

    from runner.loaded_model import LoadedModel
    from runner.server.app import ServerState, create_app
    from runner.server.engine_thread import EngineThread

    # NOTE: the engine thread must get the GIL back the moment llama_decode returns; the default 5 ms
    # switch interval lets the HTTP thread hold it that long and leaves the cores idle meanwhile.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    log = (lambda _: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    loaded = LoadedModel(args.model, from_args(EngineOptions, args), log=log)
    engine_thread = EngineThread(loaded.engine, on_error=lambda exc: print(f"engine error: {exc!r}", file=sys.stderr))
    engine_thread.start()
    state = ServerState(loaded, engine_thread, [loaded.name, *args.alias], args.api_key,
                        stream_interval_s=args.stream_interval / 1000)
    config = uvicorn.Config(create_app(state), host=args.host, port=args.port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    _announce_when_ready(server, loaded.name, loaded.options.parallel, on_ready)
    try:
        server.run()
    finally:
        state.close()
    return 0


def _announce_when_ready(server: object, name: str, n_slots: int, on_ready: Callable[[str], None] | None) -> None:
    """Print the URL once uvicorn has bound (with --port 0 the port is only known then)."""
    original = server.startup  # type: ignore[attr-defined]

    async def startup(sockets: object = None) -> None:
        await original(sockets=sockets)
        for s in server.servers:  # type: ignore[attr-defined]
            for sock in s.sockets:
                host, port = sock.getsockname()[:2]
                print(f"runner: serving {name} with {n_slots} slots on http://{host}:{port} (Ctrl-C to stop)",
                      file=sys.stderr, flush=True)
                if on_ready is not None:
                    on_ready(f"http://{host}:{port}/")

    server.startup = startup  # type: ignore[attr-defined]
