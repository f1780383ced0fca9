"""`runner serve [MODEL...]`: one named model is served in this process (server/serve.py); none
or several, or --models-dir/--models-config, start a router that serves them all, each loaded on
demand into its own process."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from runner.catalog.catalog import Catalog
from runner.catalog.embedded import embedded_model, embedded_name
from runner.catalog.store import ModelStore
from runner.config.options import EngineOptions, from_args, in_range
from runner.core.errors import OptionError, RunnerError
from runner.config.keep_alive import describe, parse_keep_alive
from runner.router.model_process import ModelProcess
from runner.router.servable import ServableModel, name_of, read_models_config, servable_models
from runner.runtime.gguf_file import GgufInfo, read_gguf
from runner.runtime.gpu_fit import Offload
from runner.runtime.layer_split import parse_tensor_split
from runner.runtime.memory_plan import MemoryPlan, available_ram_bytes, layer_costs
from runner.runtime.rpc_address import parse_workers
from runner.server.serve import (api_key, cmd_serve, host_policy, listening_sockets, ollama_port, print_ready,
                                 serve_flags_for_models, uvicorn_logging)

DEFAULT_KEEP_ALIVE = "30m"


def add_router_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models-dir", type=Path, default=None, metavar="DIR",
                   help="also serve every GGUF under DIR, named by its file name")
    p.add_argument("--models-config", type=Path, default=None, metavar="FILE",
                   help="per-model settings: a TOML file of [models.\"NAME\"] sections with engine options "
                        "(ctx_size, parallel, kv_type, spec, draft, ...), aliases, pin, keep_alive, and model "
                        "(what to load, for a name of its own)")
    p.add_argument("--keep-alive", default=DEFAULT_KEEP_ALIVE, metavar="DURATION",
                   help="an idle model stays loaded this long (30s, 5m, 1h; 0: unload when its last request "
                        f"ends; -1: forever; default {DEFAULT_KEEP_ALIVE}); a request's keep_alive field sets its own")
    p.add_argument("--max-models", type=in_range(int, 0), default=0, metavar="N",
                   help="most models loaded at once (default 0: as many as memory holds)")
    p.add_argument("--pin", action="append", default=[], metavar="MODEL",
                   help="keep this model loaded: never unloaded to make room or for being idle, only when asked "
                        "(POST /models/unload, a request's keep_alive 0); repeatable")
    p.add_argument("--no-preload", action="store_true", help="load nothing at start (default: the first model)")
    p.add_argument("--max-memory", type=_size, default=None, metavar="SIZE",
                   help="memory the loaded models may plan to use in all, e.g. 6GiB (default: what is free)")


def _size(text: str) -> int:
    units = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
    number = text.rstrip("bBiIkKmMgG")
    unit = text[len(number):].lower()
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in units or not value > 0:
        raise argparse.ArgumentTypeError(f"expected a size such as 6GiB or 500MB, got {text!r}")
    return int(value * units[unit])


def is_router(args: argparse.Namespace) -> bool:
    if args.rpc and not args.model_process:  # a lost RPC worker aborts the process holding the model: not this one
        return True
    return (len(args.models) != 1 or args.models_dir is not None or args.models_config is not None) and not (
        not args.models and embedded_model() is not None)  # the executable serves the model it carries


def cmd_serve_models(args: argparse.Namespace, on_ready: Callable[[str], None] | None = None) -> int:
    if not is_router(args):
        catalog = Catalog.load()
        args.model = args.models[0] if args.models else embedded_name({n: catalog.resolve(n).file
                                                                       for n in catalog.names()})
        return cmd_serve(args, on_ready)
    return cmd_router(args, on_ready)


def cmd_router(args: argparse.Namespace, on_ready: Callable[[str], None] | None = None) -> int:
    import uvicorn

    from runner.router.app import create_router_app
    from runner.router.model_pool import ModelPool
    from runner.router.state import RouterState
    from runner.server.uvicorn_server import CancellingServer

    store = ModelStore()
    options = from_args(EngineOptions, args)
    if options.rpc:
        parse_workers(options.rpc)  # a malformed --rpc is one line now, not a failed load per request
    config = read_models_config(args.models_config) if args.models_config else {}
    if args.alias:  # in a router, the first model's
        first = args.models[0] if args.models else store.catalog.default
        section = config.setdefault(name_of(first, store.catalog), {})
        section["aliases"] = [*section.get("aliases", []), *args.alias]
    models = _pinned(servable_models(args.models, options, store, args.models_dir, config), args.pin)
    if not models:
        raise OptionError("nothing to serve: no MODEL, no cached or catalog model and no GGUF in --models-dir")
    log = (lambda _: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    listening = listening_sockets(args)
    sockets = Path(tempfile.mkdtemp(prefix="runner-"))  # 0700: only this user reaches the model processes
    serve_flags = serve_flags_for_models(args)
    n_spawned = iter(range(1 << 30))

    def spawn(model: ServableModel) -> ModelProcess:
        return ModelProcess(model, sockets / f"m{next(n_spawned)}.sock", serve_flags, log)

    async def plan_bytes(model: ServableModel) -> int:
        return await asyncio.to_thread(memory_plan_bytes, model, store)

    keep_alive = parse_keep_alive(args.keep_alive)
    pool = ModelPool(models, spawn, plan_bytes, keep_alive_s=keep_alive, max_models=args.max_models,
                     memory_budget_bytes=args.max_memory, available_bytes=available_ram_bytes,
                     max_waiting=options.max_queue, n_threads=options.threads, log=log)
    state = RouterState(pool, api_key(args), host_policy(args), _names(args.cors_origins),
                        int(args.max_body_mb * 1e6), max_n=options.parallel, slot_context=models[0].options.ctx_size,
                        preload=not args.no_preload, describe=header_reader(store), store=store, options=options,
                        ollama_port=ollama_port(listening))
    n_models = f"{len(models)} model{'s' if len(models) > 1 else ''}"
    log(f"runner: {n_models} servable (first: {models[0].name}); idle models unload after {describe(keep_alive)}")

    def remove_sockets_dir() -> None:
        if sockets.exists() and not any(sockets.iterdir()):
            sockets.rmdir()

    config_ = uvicorn.Config(create_router_app(state, log, remove_sockets_dir), host=args.host, port=args.port,
                             **uvicorn_logging(args), timeout_graceful_shutdown=3)
    server = CancellingServer(config_, on_exit=pool.terminate_all)
    print_ready(server, n_models, "", on_ready)
    try:
        server.run(sockets=listening)
    finally:
        remove_sockets_dir()
    return 0


def _pinned(models: list[ServableModel], pins: list[str]) -> list[ServableModel]:
    """The models, those --pin names never unloaded."""
    ids = {model_id for m in models for model_id in m.ids}
    for name in pins:
        if name not in ids:
            raise OptionError(f"--pin {name}: not a model this server serves ({', '.join(m.name for m in models)})")
    return [dataclasses.replace(m, is_pinned=True) if set(m.ids) & set(pins) else m for m in models]


def _names(text: str) -> frozenset[str]:
    return frozenset(n.strip() for n in text.split(",") if n.strip())


def header_reader(store: ModelStore) -> Callable[[ServableModel], GgufInfo | None]:
    """A servable model's GGUF header without loading it (None: not in the cache), read once per file."""
    read: dict[tuple[Path, int], GgufInfo] = {}

    def describe(model: ServableModel) -> GgufInfo | None:
        try:
            path = store.resolve(model.source, pull_missing=False)[0]
            key = (path, path.stat().st_mtime_ns)
            if key not in read:
                read[key] = read_gguf(path)
            return read[key]
        except (RunnerError, OSError):
            return None

    return describe


def memory_plan_bytes(model: ServableModel, store: ModelStore) -> int:
    """What the model would take (weights, KV, compute; its draft's too), from the GGUF headers; the
    model is pulled first if it is not cached (RunnerError when it cannot be)."""
    path, ref = store.resolve(model.source)
    info = read_gguf(path)
    plan = MemoryPlan.for_model(info, model.options)
    opts = model.options
    draft = opts.draft or (ref.entry.draft if ref and ref.entry.draft and opts.spec in ("auto", "on") else "")
    if draft and draft != "ngram" and opts.spec != "off":
        try:
            plan = plan.with_draft(MemoryPlan.for_draft(read_gguf(store.resolve(draft)[0]), opts))
        except RunnerError:
            pass  # the model process says what is wrong with its draft
    if opts.rpc:  # what stays on this machine: the workers hold the rest (asked of no worker here: each serves one head)
        costs = layer_costs(info, opts)
        split = parse_tensor_split(opts.tensor_split, len(parse_workers(opts.rpc)))
        n_offloaded = split.n_gpu_layers(costs.n_layer) if split else -1
        offload = Offload(n_offloaded, costs.n_layer, costs.on_gpu(n_offloaded), 0, (), False)
        return dataclasses.replace(plan, offload=offload).ram_bytes
    return plan.total_bytes
