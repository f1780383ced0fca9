"""Serving several models: what the router costs and what it gives.

    python bench/router.py [--part overhead load pair] [--repeats 3]

overhead: one model through the router (its own process behind a Unix socket) against today's
  single-model server, alternating pairs at 1 and 8 clients: throughput and mean TTFT ratios.
load: a request for a model that is not loaded, from sending it to its first token, against the
  wall time of `runner run MODEL --max-tokens 1` (a process that starts, loads and answers).
pair: two models busy at once (clients for both together) against the same clients for one model,
  then the other: total tokens/s.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from common import model_path, print_table  # noqa: E402
from sse_clients import run_clients  # noqa: E402
from vs_llama_server import ALIAS, Shape, bodies, free_port, ours_command, serve, stop  # noqa: E402

from runner.config.options import physical_cores  # noqa: E402


def router_command(models: list[str], shape: Shape, port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "runner", "serve", *models, "--alias", ALIAS, "--port", str(port),
            "--parallel", str(shape.slots), "--ctx-size", str(shape.ctx_per_slot), "--batch-size", str(shape.batch),
            "--threads", str(shape.threads), "-q", *extra]


def timed_load(command: list[str], port: int, concurrency: int, rounds: int, max_tokens: int) -> tuple[float, float]:
    proc = serve(command, port)
    try:
        url = f"http://127.0.0.1:{port}"
        run_clients(url, bodies(concurrency, 1, 8, warm_up=True))
        load = run_clients(url, bodies(concurrency, rounds, max_tokens))
    finally:
        stop(proc)
    assert load.n_tokens == concurrency * rounds * max_tokens, load.n_tokens
    return load.n_tokens / load.elapsed_s, statistics.fmean(load.ttfts)


def part_overhead(args: argparse.Namespace, model: Path, empty_config: Path) -> None:
    rows = []
    for c in (1, 8):
        shape = Shape(8, args.ctx, 512, args.threads)
        pairs = []
        for r in range(args.repeats):
            runs = {}
            for who in (("router", "single") if r % 2 == 0 else ("single", "router")):
                port = free_port()
                command = (router_command([str(model)], shape, port, "--models-config", str(empty_config))
                           if who == "router" else ours_command(model, shape, port))
                runs[who] = timed_load(command, port, c, args.rounds, args.max_tokens)
                print(f"  c={c} pair {r} {who}: {runs[who][0]:.1f} tok/s, TTFT {runs[who][1] * 1000:.0f} ms",
                      file=sys.stderr)
            pairs.append(runs)
        rows.append([c, statistics.median(p["router"][0] / p["single"][0] for p in pairs),
                     statistics.median(p["router"][1] / p["single"][1] for p in pairs),
                     statistics.median(p["single"][1] for p in pairs) * 1000,
                     statistics.median(p["router"][1] for p in pairs) * 1000])
    print(f"\none model through the router vs the single-model server, 8 slots, {args.max_tokens} tokens x "
          f"{args.rounds} requests per client, {args.repeats} alternating pairs (medians)\n")
    print_table(["clients", "throughput router/single", "TTFT router/single", "single TTFT ms", "router TTFT ms"],
                rows)


def part_load(args: argparse.Namespace, names: list[str]) -> None:
    rows = []
    for name in names:
        runs, loads = [], []
        for _ in range(args.repeats):
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "runner", "run", name, "-p", "Hi", "--max-tokens", "1", "-q",
                            "--parallel", "1", "--ctx-size", str(args.ctx)], check=True, capture_output=True)
            runs.append(time.perf_counter() - started)
        port = free_port()
        proc = serve(router_command(names, Shape(1, args.ctx, 512, args.threads), port, "--no-preload"), port)
        try:
            url = f"http://127.0.0.1:{port}"
            for _ in range(args.repeats):
                load = run_clients(url, [[{"model": name, "messages": [{"role": "user", "content": "Hi"}],
                                           "max_tokens": 1, "temperature": 0}]])
                loads.append(load.ttfts[0])
                httpx.post(url + "/models/unload", json={"model": name}, timeout=60).raise_for_status()
        finally:
            stop(proc)
        rows.append([name, statistics.median(runs), statistics.median(loads),
                     statistics.median(loads) / statistics.median(runs)])
    print(f"\na request for an unloaded model (1 slot of {args.ctx}), {args.repeats} runs (medians)\n")
    print_table(["model", "runner run s", "router first token s", "router/run"], rows)


def part_pair(args: argparse.Namespace, names: list[str]) -> None:
    shape = Shape(4, args.ctx, 512, args.threads)
    port = free_port()
    proc = serve(router_command(names, shape, port, "--keep-alive", "-1"), port)
    try:
        url = f"http://127.0.0.1:{port}"

        def plan(name: str) -> list[list[dict]]:
            return [[{**b, "model": name} for b in client] for client in bodies(4, args.rounds, args.max_tokens)]

        for name in names:  # load both, warm both
            run_clients(url, [[{**b, "model": name} for b in c] for c in bodies(4, 1, 8, warm_up=True)])
        rows = []
        for r in range(args.repeats):
            started = time.perf_counter()
            n_alone = sum(run_clients(url, plan(name)).n_tokens for name in names)
            alone_s = time.perf_counter() - started
            together = run_clients(url, plan(names[0]) + plan(names[1]))
            rows.append([r, n_alone / alone_s, together.n_tokens / together.elapsed_s,
                         (together.n_tokens / together.elapsed_s) / (n_alone / alone_s)])
    finally:
        stop(proc)
    print(f"\n{names[0]} and {names[1]}, 4 clients each, {args.max_tokens} tokens x {args.rounds} requests, "
          f"{args.threads} threads per model process\n")
    print_table(["round", "one after the other tok/s", "both at once tok/s", "at once / one after the other"], rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", nargs="+", default=["overhead", "load", "pair"], choices=["overhead", "load", "pair"])
    ap.add_argument("--models", nargs=2, default=["smollm2-135m-instruct", "gemma-3-270m"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=physical_cores())
    args = ap.parse_args()
    for name in args.models:
        model_path(name)  # pulled once, before anything is timed
    with tempfile.TemporaryDirectory() as tmp:
        empty_config = Path(tmp) / "models.toml"
        empty_config.write_text("")
        if "overhead" in args.part:
            part_overhead(args, model_path(args.models[0]), empty_config)
        if "load" in args.part:
            part_load(args, args.models)
        if "pair" in args.part:
            part_pair(args, args.models)


if __name__ == "__main__":
    main()
