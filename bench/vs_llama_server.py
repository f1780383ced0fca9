"""runner's server against llama.cpp's own server, side by side: time to first token and throughput.

Both serve the same GGUF with the same slots, context per slot, batch size and threads; the same
streaming clients (bench/sse_clients.py) send the same chat requests (greedy, end-of-text ignored,
every reply --max-tokens long). Both servers are up and warmed at once, and they take turns under
load (the other one idle): a turn is every client sending --rounds requests one after another, and
a pair is one turn each, in the order ours-theirs, theirs-ours, ... so that each pair's ratio
(ours/theirs) comes from the same few seconds of this machine. The table gives medians.

    bash bench/build_llama_server.sh          # once: llama-server from our pinned llama.cpp
    python bench/vs_llama_server.py [--llama-server PATH] [--concurrency 1 8] [--slots N] [--repeats 11]

TTFT is the time from sending a request to its first content chunk, over every request of a turn;
requests are sent one after another per client, so from the second on, a client's request
arrives while the others' replies are decoding.

--fresh-servers starts both servers again before every pair: a process's memory layout can move
a long prompt's time by several percent for its whole life, so that one process pair's ratio is
not the servers' (see docs/benchmarks.md).

--count-graphs preloads bench/graph_counter.c into both servers (a C compiler builds it) and adds
the graph runs a turn took (llama.cpp's micro-batches) and the turn's time outside them.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import struct
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from common import CHAT_PROMPTS as PROMPTS  # noqa: E402
from common import model_path, print_table  # noqa: E402
from sse_clients import run_clients  # noqa: E402

from runner.config.options import physical_cores  # noqa: E402
from runner.runtime.llama import uses_extra_buffers  # noqa: E402

WARM_UP = "Say hello to client {}."  # (no timed prompt repeats it: neither server finds a timed prompt cached)
ALIAS = "bench"
WHO = ("ours", "theirs")
DEFAULT_LLAMA_SERVER = Path(__file__).parent.parent / ".cache/llama-server"
GRAPH_COUNTER_SOURCE = Path(__file__).parent / "graph_counter.c"
GRAPH_COUNTER_LIB = Path(__file__).parent.parent / ".cache/graph_counter.so"


@dataclass(frozen=True)
class Shape:
    slots: int
    ctx_per_slot: int
    batch: int
    threads: int


@dataclass(frozen=True)
class Run:
    tokens_per_s: float
    mean_ttft_s: float
    n_tokens: int
    n_graphs: int = 0  # graph runs (with --count-graphs)
    outside_graphs_s: float = 0.0  # the turn's time outside them


class GraphCounter:
    """A server's graph runs and the time in them, read from the file graph_counter.c maps."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @staticmethod
    def build() -> Path:
        if not GRAPH_COUNTER_LIB.exists() or GRAPH_COUNTER_LIB.stat().st_mtime < GRAPH_COUNTER_SOURCE.stat().st_mtime:
            GRAPH_COUNTER_LIB.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(GRAPH_COUNTER_LIB), str(GRAPH_COUNTER_SOURCE),
                            "-ldl"], check=True)
        return GRAPH_COUNTER_LIB

    def env(self) -> dict[str, str]:
        self.path.unlink(missing_ok=True)
        return {**os.environ, "LD_PRELOAD": str(self.build()), "GRAPH_COUNTER_FILE": str(self.path)}

    def read(self) -> tuple[int, float]:
        """(graph runs, seconds in them) so far."""
        n, ns = struct.unpack("<QQ", self.path.read_bytes()[:16]) if self.path.exists() else (0, 0)
        return n, ns / 1e9


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_flags(gpu_layers: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """--gpu-layers for both servers (ours, theirs): a count, all, or None (each server's default)."""
    if gpu_layers is None:
        return (), ()
    ours = "-1" if gpu_layers == "all" else gpu_layers
    return ("--n-gpu-layers", ours), ("-ngl", gpu_layers)


def ours_command(model: Path, shape: Shape, port: int, extra: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "runner", "serve", str(model), "--alias", ALIAS, "--port", str(port),
            "--parallel", str(shape.slots), "--ctx-size", str(shape.ctx_per_slot), "--batch-size", str(shape.batch),
            "--threads", str(shape.threads), "-q", *extra]


def theirs_command(binary: Path, model: Path, shape: Shape, port: int, extra: tuple[str, ...] = ()) -> list[str]:
    # -c is the whole KV (split across -np slots); with -np given, each slot has its own KV stream (kv_unified
    # false, llama-server only unifies it when it picks the slot count itself), as runner does;
    # --no-repack where runner turns llama.cpp's extra weight buffers off too (a CPU with AMX: they crash there)
    same_buffers = () if uses_extra_buffers() else ("--no-repack",)
    return [str(binary), "-m", str(model), "--alias", ALIAS, "--port", str(port), "--host", "127.0.0.1",
            "-np", str(shape.slots), "-c", str(shape.slots * shape.ctx_per_slot), "-b", str(shape.batch),
            "-t", str(shape.threads), "-tb", str(shape.threads), "--no-webui", "--jinja", *same_buffers, *extra]


def serve(command: list[str], port: int, env: dict[str, str] | None = None) -> subprocess.Popen:
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{command[0]} exited: {proc.stderr.read().decode(errors='replace')[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{command[0]} did not come up in 120 s")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def reply_length(max_tokens: int, spread: float, turn: int, c: int, r: int) -> int:
    """A request's reply length: max_tokens, or with a spread drawn from [1 - spread, 1 + spread]
    times it, the same for both servers (seeded by turn, client and round)."""
    if not spread:
        return max_tokens
    return max(1, round(max_tokens * random.Random(f"{turn}-{c}-{r}").uniform(1 - spread, 1 + spread)))


def bodies(concurrency: int, rounds: int, max_tokens: int, warm_up: bool = False,
           prompts: list[str] = PROMPTS, turn: int = 0, temperature: float = 0.0,
           spread: float = 0.0) -> list[list[dict]]:
    """Each client's requests in one turn; every prompt differs from every other in the run (a
    numbered question once the prompts are used up), so what a server reuses is only the chat
    template's common head."""
    def prompt(c: int, r: int) -> str:
        k = (turn * concurrency + c) * rounds + r
        if warm_up:
            return WARM_UP.format(c)
        return prompts[k % len(prompts)] if k < len(prompts) else f"Question {k}: {prompts[k % len(prompts)]}"

    return [[{"model": ALIAS, "messages": [{"role": "user", "content": prompt(c, r)}],
              "max_tokens": reply_length(max_tokens, 0.0 if warm_up else spread, turn, c, r),
              "temperature": temperature, "ignore_eos": True} for r in range(rounds)] for c in range(concurrency)]


def measure(command: list[str], port: int, concurrency: int, rounds: int, max_tokens: int,
            prompts: list[str] = PROMPTS) -> Run:
    """A server started, warmed, given one turn, stopped."""
    proc, url = started(command, port, concurrency)
    try:
        return turn(url, concurrency, rounds, max_tokens, prompts)
    finally:
        stop(proc)


def turn(url: str, concurrency: int, rounds: int, max_tokens: int, prompts: list[str] = PROMPTS,
         index: int = 0, temperature: float = 0.0, counter: GraphCounter | None = None, spread: float = 0.0) -> Run:
    """One turn: every client sends its requests one after another."""
    n0, s0 = counter.read() if counter else (0, 0.0)
    plan = bodies(concurrency, rounds, max_tokens, prompts=prompts, turn=index, temperature=temperature, spread=spread)
    load = run_clients(url, plan)
    expected = sum(body["max_tokens"] for requests in plan for body in requests)
    if load.n_tokens != expected:
        raise RuntimeError(f"{url} generated {load.n_tokens} tokens, not {expected}")
    n1, s1 = counter.read() if counter else (0, 0.0)
    return Run(load.n_tokens / load.elapsed_s, statistics.fmean(load.ttfts), load.n_tokens, n1 - n0,
               load.elapsed_s - (s1 - s0))


def started(command: list[str], port: int, concurrency: int,
            env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """A server up and warmed (weights paged in, graphs built for this many clients)."""
    proc = serve(command, port, env)
    url = f"http://127.0.0.1:{port}"
    try:
        run_clients(url, bodies(concurrency, 1, 8, warm_up=True))
    except BaseException:
        stop(proc)
        raise
    return proc, url


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--llama-server", type=Path, default=None,
                    help="llama.cpp's server binary (default: the one bench/build_llama_server.sh built)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--slots", type=int, default=None, help="slots of both servers (default: one per client)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--max-tokens-spread", type=float, default=0.0,
                    help="each reply's length drawn from [1 - S, 1 + S] times --max-tokens (the same for both "
                         "servers), so that clients do not finish in step")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="0: greedy; above it both servers sample with their defaults (top-k 40, top-p 0.95, min-p 0.05)")
    ap.add_argument("--rounds", type=int, default=3, help="requests each client sends one after another, per turn")
    ap.add_argument("--threads", type=int, default=physical_cores())
    ap.add_argument("--ctx-per-slot", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=11, help="ours/theirs pairs per concurrency (medians taken)")
    ap.add_argument("--gpu-layers", default=None, help="layers on the GPU for both servers: a count or all "
                                                         "(default: each server's own, auto for both)")
    ap.add_argument("--prompt-repeat", type=int, default=1,
                    help="each prompt this many times over (a long prompt: TTFT then measures prefill)")
    ap.add_argument("--fresh-servers", action="store_true",
                    help="start both servers again before every pair: where a process's memory layout decides "
                         "a few percent (long prompts: two identical llama.cpp contexts in one process differ "
                         "by up to 10%%), each pair then draws its own")
    ap.add_argument("--count-graphs", action="store_true",
                    help="also the graph runs a turn took on each server, and its time outside them")
    args = ap.parse_args()
    ours_gpu, theirs_gpu = gpu_flags(args.gpu_layers)
    prompts = [" ".join([p] * args.prompt_repeat) for p in PROMPTS]
    binary = args.llama_server or next(DEFAULT_LLAMA_SERVER.glob("llama_cpp_python-*/vendor/llama.cpp/build/bin/"
                                                                  "llama-server"), None)
    if binary is None or not binary.exists():
        sys.exit("no llama-server: run `bash bench/build_llama_server.sh` or pass --llama-server PATH")
    model = model_path(args.model)
    rows = []
    for c in args.concurrency:
        shape = Shape(args.slots or c, args.ctx_per_slot, args.batch, args.threads)
        counters = {who: GraphCounter(Path(f"/tmp/runner-bench-graphs-{os.getpid()}-{who}")) for who in WHO}
        servers: dict[str, tuple[subprocess.Popen, str]] = {}

        def launch(who: str) -> None:
            """Start (or start again) one server, on a port of its own (an old one may linger in TIME_WAIT)."""
            if who in servers:
                stop(servers.pop(who)[0])
            port = free_port()
            command = (ours_command(model, shape, port, ours_gpu) if who == "ours"
                       else theirs_command(binary, model, shape, port, theirs_gpu))
            servers[who] = started(command, port, c, counters[who].env() if args.count_graphs else None)

        try:
            for who in WHO:
                launch(who)
            pairs = []
            for r in range(args.repeats):
                if args.fresh_servers and r > 0:  # a new process pair: its own memory layout
                    for who in WHO:
                        launch(who)
                runs = {}
                for who in (("ours", "theirs") if r % 2 == 0 else ("theirs", "ours")):  # alternate who goes first
                    for attempt in (1, 2):  # a server that stopped answering: started again, the turn again
                        try:
                            runs[who] = turn(servers[who][1], c, args.rounds, args.max_tokens, prompts, r, args.temperature,
                                             counters[who] if args.count_graphs else None, args.max_tokens_spread)
                            break
                        except TimeoutError as exc:
                            if attempt == 2:
                                raise
                            print(f"  c={c} pair {r} {who}: {exc}; restarting it", file=sys.stderr)
                            launch(who)
                    print(f"  c={c} pair {r} {who}: {runs[who].tokens_per_s:.1f} tok/s, "
                          f"mean TTFT {runs[who].mean_ttft_s * 1000:.0f} ms"
                          + (f", {runs[who].n_graphs} graphs, {runs[who].outside_graphs_s:.2f} s outside them"
                             if args.count_graphs else ""), file=sys.stderr)
                pairs.append(runs)
        finally:
            for proc, _ in servers.values():
                stop(proc)
            for counter in counters.values():
                counter.path.unlink(missing_ok=True)
        med = lambda who, f: statistics.median(f(p[who]) for p in pairs)  # noqa: E731
        rows.append([c, shape.slots, len(pairs), med("ours", lambda x: x.tokens_per_s), med("theirs", lambda x: x.tokens_per_s),
                     statistics.median(p["ours"].tokens_per_s / p["theirs"].tokens_per_s for p in pairs),
                     med("ours", lambda x: x.mean_ttft_s) * 1000, med("theirs", lambda x: x.mean_ttft_s) * 1000,
                     statistics.median(p["ours"].mean_ttft_s / p["theirs"].mean_ttft_s for p in pairs)]
                    + ([med(who, f) for f in (lambda x: x.n_graphs, lambda x: x.outside_graphs_s) for who in ("ours", "theirs")]
                       if args.count_graphs else []))
    print(f"\nmodel {args.model}, {args.max_tokens} tokens per reply"
          + (f" (x{1 - args.max_tokens_spread:g}-{1 + args.max_tokens_spread:g})" if args.max_tokens_spread else "")
          + f", {args.rounds} requests per client, "
          f"{args.threads} threads, " + (f"temperature {args.temperature:g}" if args.temperature else "greedy")
          + f", {args.repeats} pairs per row (medians)"
          + (f", GPU layers {args.gpu_layers}" if args.gpu_layers else "")
          + (f", each prompt x{args.prompt_repeat}" if args.prompt_repeat > 1 else "") + "\n")
    print_table(["clients", "slots", "pairs", "ours tok/s", "llama-server tok/s", "throughput ours/theirs", "ours mean TTFT ms",
                 "llama-server mean TTFT ms", "TTFT ours/theirs"]
                + (["ours graphs/turn", "llama-server graphs/turn", "ours s outside graphs/turn",
                    "llama-server s outside graphs/turn"] if args.count_graphs else []), rows)


if __name__ == "__main__":
    main()
