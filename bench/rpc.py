"""A model split across RPC workers against the same model run here: what llama.cpp's RPC protocol
costs. On one machine the workers share its cores with the head, so this measures the protocol's
overhead (every layer's activations through a socket, one worker after the other), never a
speed-up: RPC is for fitting a model that one machine cannot hold.

    python bench/rpc.py [--repeats 3] [--max-tokens 64] [--rounds 2]

decode: tokens/s of 1 and 4 streaming clients, through the router in both cases (`serve --rpc`
  always runs the model in a process of its own), SmolLM2 on two loopback workers against local.
prompt: time to first token of a ~600-token prompt (1 and 4 clients at once), split against local.
load: `runner run --max-tokens 1` wall time, split against local; then with the workers'
  --cache-dir: a first load (the weights sent and kept) and a second (only their hashes sent).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from common import model_path, print_table  # noqa: E402
from router import router_command  # noqa: E402
from rpc_workers import Worker  # noqa: E402
from sse_clients import run_clients  # noqa: E402
from vs_llama_server import ALIAS, Shape, bodies, free_port, serve, stop  # noqa: E402

from runner.config.options import physical_cores  # noqa: E402

MODEL = "smollm2-135m-instruct"
LONG_PROMPT = "Summarise the following notes in one sentence. " + " ".join(
    f"Note {i}: the shipment of part {i * 7} arrived on day {i % 28 + 1} and was checked by team {i % 5}."
    for i in range(32))


def server_runs(command: list[str], port: int, args: argparse.Namespace) -> dict[str, float]:
    """Decode tok/s and prompt TTFT at 1 and 4 clients, for one server."""
    proc = serve(command, port)
    out = {}
    try:
        url = f"http://127.0.0.1:{port}"
        run_clients(url, bodies(4, 1, 8, warm_up=True))
        for c in (1, 4):
            load = run_clients(url, bodies(c, args.rounds, args.max_tokens))
            assert load.n_tokens == c * args.rounds * args.max_tokens, load.n_tokens
            out[f"decode{c}"] = load.n_tokens / load.elapsed_s
            prompts = [[{"model": ALIAS, "max_tokens": 1, "temperature": 0,
                         "messages": [{"role": "user", "content": f"({k}) {LONG_PROMPT}"}]}] for k in range(c)]
            out[f"prompt{c}"] = statistics.fmean(run_clients(url, prompts).ttfts)
    finally:
        stop(proc)
    return out


def wall_of_run(*extra: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "runner", "run", MODEL, "-p", "Hi", "--max-tokens", "1", "-q",
                    "--parallel", "1", "--ctx-size", "512", *extra], check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=physical_cores())
    args = ap.parse_args()
    model_path(MODEL)
    workers = [Worker(), Worker()]
    rpc = f"{workers[0].address},{workers[1].address}"
    empty = Path(tempfile.mkdtemp()) / "models.toml"
    empty.write_text("")
    shape = Shape(4, 1024, 512, args.threads)
    runs: dict[str, list[dict[str, float]]] = {"local": [], "split": []}
    try:
        for r in range(args.repeats):
            for who in (("local", "split") if r % 2 == 0 else ("split", "local")):
                port = free_port()
                extra = ("--rpc", rpc) if who == "split" else ()
                runs[who].append(server_runs(router_command([MODEL], shape, port, "--models-config", str(empty),
                                                            *extra), port, args))
                print(f"  pair {r} {who}: {runs[who][-1]}", file=sys.stderr)
        loads = {"local": [wall_of_run() for _ in range(args.repeats)],
                 "split": [wall_of_run("--rpc", rpc) for _ in range(args.repeats)]}
        for w in workers:
            w.kill()
        cache = Path(tempfile.mkdtemp())
        workers = [Worker(cache_dir=cache / "a"), Worker(cache_dir=cache / "b")]
        rpc = f"{workers[0].address},{workers[1].address}"
        first_cached = wall_of_run("--rpc", rpc)
        second_cached = statistics.median(wall_of_run("--rpc", rpc) for _ in range(args.repeats))
    finally:
        for w in workers:
            w.kill()

    def med(who: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[who])

    rows = [[f"decode tok/s, {c} client{'s' * (c > 1)}", med("local", f"decode{c}"), med("split", f"decode{c}"),
             med("split", f"decode{c}") / med("local", f"decode{c}")] for c in (1, 4)]
    rows += [[f"prompt TTFT s (~600 tokens), {c} at once", med("local", f"prompt{c}"), med("split", f"prompt{c}"),
              med("split", f"prompt{c}") / med("local", f"prompt{c}")] for c in (1, 4)]
    local_load = statistics.median(loads["local"])
    rows += [["load + 1 token s (runner run)", local_load, statistics.median(loads["split"]),
              statistics.median(loads["split"]) / local_load],
             ["  with the workers' --cache-dir, first load", local_load, first_cached, first_cached / local_load],
             ["  with the workers' --cache-dir, second load", local_load, second_cached, second_cached / local_load]]
    print(f"\n{MODEL} on two loopback RPC workers (all layers there) vs here, {args.threads} threads, "
          f"{args.max_tokens} tokens x {args.rounds} requests per client, {args.repeats} alternating pairs "
          "(medians); one machine: the protocol's overhead, not a speed-up\n")
    print_table(["measure", "local", "split over 2 workers", "split/local"], rows)


if __name__ == "__main__":
    main()
