"""`runner rpc-worker`: lend this machine's CPU or GPU to a runner on another machine that holds a
model too big for it alone (its `--rpc HOST:PORT`), through llama.cpp's RPC backend."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runner.config.options import PORT, physical_cores
from runner.core.errors import RunnerError

UNSAFE_NOTE = ("runner: note: the RPC protocol has no authentication and no encryption: anyone who reaches "
               "{where} can run computations on this machine and read what it holds for the head. Keep it on "
               "a network you trust, or bind 127.0.0.1 and tunnel it (on the head: ssh -N -L "
               "{port}:127.0.0.1:{port} THIS_HOST, then --rpc 127.0.0.1:{port})")


def add_rpc_worker_flags(p: argparse.ArgumentParser) -> None:
    from runner.runtime.rpc_address import DEFAULT_PORT

    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; any other needs --allow-network)")
    p.add_argument("--port", type=PORT, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT})")
    p.add_argument("--device", default="", metavar="cpu|gpu0|NAME[,...]",
                   help="what to serve: cpu, gpuN (the Nth GPU) or llama.cpp's device name (CUDA0), comma-separated "
                        "(default: every GPU, else the CPU)")
    p.add_argument("--threads", type=int, default=physical_cores(), help="CPU threads (default: physical cores)")
    p.add_argument("--cache-dir", type=Path, default=None, metavar="DIR",
                   help="keep the weights heads send here, so a head's next load sends only their hashes")
    p.add_argument("--allow-network", action="store_true",
                   help="allow --host to be an address other machines reach (the protocol is unauthenticated)")


def cmd_rpc_worker(args: argparse.Namespace) -> int:
    from runner.runtime import rpc
    from runner.runtime.llama import show_errors
    from runner.runtime.rpc_address import parse_endpoint

    rpc.require_rpc()
    endpoint = parse_endpoint(f"{args.host}:{args.port}")
    if not endpoint.is_loopback:
        if not args.allow_network:
            raise RunnerError(f"--host {args.host} lets other machines use this one through an unauthenticated "
                              "protocol: add --allow-network if that is meant, or tunnel a loopback worker over SSH")
        print(UNSAFE_NOTE.format(where=endpoint.text, port=args.port), file=sys.stderr, flush=True)
    names = device_names(args.device)
    if args.cache_dir is not None:
        args.cache_dir.mkdir(parents=True, exist_ok=True)
    print(f"runner: RPC worker on {endpoint.text} serving {', '.join(names)} (protocol "
          f"{rpc.PROTOCOL[0]}.{rpc.PROTOCOL[1]}); heads connect with --rpc {endpoint.text}", file=sys.stderr, flush=True)
    show_errors()  # ggml-rpc's complaints (a head of another version) go to its log
    rpc.serve_worker(endpoint, args.cache_dir, args.threads, names)
    raise RunnerError(f"cannot listen on {endpoint.text} (in use by another process?)")


def device_names(wanted: str) -> list[str]:
    """--device's words as llama.cpp's device names."""
    from runner.runtime.llama import list_devices

    devices = list_devices()
    gpus = [d.name for d in devices if d.takes_layers]
    cpus = [d.name for d in devices if d.kind == "cpu"]
    if not wanted:
        return gpus or cpus
    names = []
    for word in (w.strip() for w in wanted.split(",") if w.strip()):
        if word.lower() == "cpu" and cpus:
            names.append(cpus[0])
        elif word.lower().startswith("gpu") and word[3:].isdigit() and int(word[3:]) < len(gpus):
            names.append(gpus[int(word[3:])])
        elif word in {d.name for d in devices}:
            names.append(word)
        else:
            raise RunnerError(f"--device {word}: this machine has {', '.join(d.name for d in devices)} "
                              f"(cpu{', gpu0' if gpus else ''} name them too)")
    return names
