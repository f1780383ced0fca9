"""Aggregate generated tokens/s under concurrency, three ways, side by side in one run:

  (a) ours:       `runner serve --parallel C`, C clients streaming over HTTP (bench/sse_clients.py);
  (b) serialized: the same requests one after another through llama-cpp-python's high-level `Llama`;
  (c) ceiling:    the exact batches our server decoded (recorded via RUNNER_BATCH_TRACE), replayed
                  through raw llama_decode + argmax with no server and no sampling: after each run
                  of (a) ("pairs"), and in turns with it, the server stopped while the replay
                  catches up ("interleaved", immune to the machine's drift between runs).

    python bench/parallel.py [--concurrency 1 2 4 8 16] [--max-tokens 128] [--rounds 2]

Every request generates exactly --max-tokens tokens (end-of-text ignored), greedy.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import CHAT_PROMPTS, model_path, print_table  # noqa: E402
from sse_clients import run_clients  # noqa: E402

from runner.runtime.llama import Batch, Context, ContextShape, Model  # noqa: E402

PROMPTS = CHAT_PROMPTS[:16]
CTX_PER_SLOT = 1024
N_BATCH = 512


def requests_for(concurrency: int, rounds: int) -> list[list[str]]:
    """Per client, the prompts it sends one after another."""
    return [[PROMPTS[(c * rounds + r) % len(PROMPTS)] for r in range(rounds)] for c in range(concurrency)]


def start_server(model: str, concurrency: int, threads: int, trace: Path) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "RUNNER_BATCH_TRACE": str(trace)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner", "serve", model, "--port", "0", "--parallel", str(concurrency),
         "--ctx-size", str(CTX_PER_SLOT), "--batch-size", str(N_BATCH), "--threads", str(threads), "-q"],
        stderr=subprocess.PIPE, text=True, env=env,
    )
    assert proc.stderr is not None
    url = None
    while url is None:
        line = proc.stderr.readline()
        if not line:
            raise RuntimeError("server failed to start")
        match = re.search(r"(http://\S+)", line)
        url = match.group(1) if match else None
    return proc, url


def warm_up(url: str, model: str) -> int:
    """Page in the weights and build the compute graphs outside the timed part; returns the
    number of decode steps that took (the ceiling replay skips as many untimed)."""
    httpx.post(url + "/v1/chat/completions", timeout=60, json={"model": model, "max_tokens": 8, "ignore_eos": True,
                                                                 "messages": [{"role": "user", "content": "Hi"}]})
    return int(re.search(r"^runner_steps_total (\d+)", httpx.get(url + "/metrics").text, re.M).group(1))


def decode_seconds(url: str) -> float:
    return float(re.search(r"^runner_decode_seconds_total (\S+)", httpx.get(url + "/metrics").text, re.M).group(1))


def request_bodies(plan: list[list[str]], max_tokens: int, model: str) -> list[list[dict]]:
    return [[{"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
              "temperature": 0, "ignore_eos": True} for prompt in prompts] for prompts in plan]


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=30)
    if proc.stderr:
        proc.stderr.close()


def run_ours(model: str, concurrency: int, plan: list[list[str]], max_tokens: int, threads: int,
             trace: Path) -> tuple[float, int, list[float], int, float]:
    proc, url = start_server(model, concurrency, threads, trace)
    n_warmup_steps = warm_up(url, model)
    decode_before = decode_seconds(url)
    load = run_clients(url, request_bodies(plan, max_tokens, model))
    decode_s = decode_seconds(url) - decode_before
    print(f"  ours: wall {load.elapsed_s:.3f} s, of which in llama_decode {decode_s:.3f} s", file=sys.stderr)
    stop_server(proc)
    return load.elapsed_s, load.n_tokens, load.ttfts, n_warmup_steps, decode_s


class Replay:
    """The ceiling: trace ops through raw llama_decode + argmax in a context of the server's shape,
    timed from the first decode after the warm-up's."""

    def __init__(self, model: Model, concurrency: int, threads: int, n_warmup_steps: int) -> None:
        shape = ContextShape(concurrency, CTX_PER_SLOT, N_BATCH, threads, kv_unified=False, n_junk_max=concurrency)
        self.ctx = Context(model, shape)
        self.batch = Batch(shape.n_batch_max)
        self.n_warmup_steps = n_warmup_steps
        self.n_decodes = 0
        self.seconds = 0.0

    def run(self, lines: list[str]) -> None:
        for line in lines:
            kind, args = json.loads(line)
            timed = self.n_decodes >= self.n_warmup_steps
            started = time.perf_counter()
            if kind == "kv_remove":
                self.ctx.kv_remove(*args)
            elif kind == "kv_copy_all":
                self.ctx.kv_copy(args[0], args[1], -1, -1)
            else:
                self.batch.clear()
                for seq_id, token_ids, first_pos, logit_offsets in args:
                    first = self.batch.n_tokens
                    self.batch.add(seq_id, token_ids, first_pos, 0)
                    for offset in logit_offsets:
                        self.batch.set_logits(first + offset)
                logits = self.ctx.decode(self.batch)
                self.n_decodes += 1
                for row in logits:
                    int(np.argmax(row))
            if timed:
                self.seconds += time.perf_counter() - started

    def close(self) -> None:
        self.ctx.close()


def run_ceiling(model: Model, concurrency: int, trace: Path, threads: int, n_warmup_steps: int) -> float:
    replay = Replay(model, concurrency, threads, n_warmup_steps)
    try:
        replay.run([line for line in trace.read_text().splitlines() if line])
        return replay.seconds
    finally:
        replay.close()


def run_interleaved(model_name: str, model: Model, concurrency: int, plan: list[list[str]], max_tokens: int,
                    threads: int, trace: Path, slice_s: float) -> tuple[float, float]:
    """Ours and its ceiling in turns of about slice_s each: the server runs while the replay waits,
    then the server is stopped (SIGSTOP) while the replay decodes what the server has traced so
    far. Both see the machine in the same seconds, so the ratio no longer carries its drift.
    Returns (seconds the server ran, seconds the replay took) for the same batches."""
    proc, url = start_server(model_name, concurrency, threads, trace)
    n_warmup = warm_up(url, model_name)
    replay = Replay(model, concurrency, threads, n_warmup)
    result: list = []
    clients = threading.Thread(target=lambda: result.append(run_clients(url, request_bodies(plan, max_tokens,
                                                                                            model_name))))
    trace_file = trace.open()
    pending = ""

    def new_lines() -> list[str]:
        nonlocal pending
        pending += trace_file.read()
        *lines, pending = pending.split("\n")
        return [line for line in lines if line]

    server_s = 0.0
    try:
        replay.run(new_lines())  # the warm-up's ops, untimed
        clients.start()
        while True:
            started = time.perf_counter()
            clients.join(timeout=slice_s)
            server_s += time.perf_counter() - started
            if not clients.is_alive():
                if not result:
                    raise RuntimeError("the clients failed (their traceback is above)")
                break
            os.kill(proc.pid, signal.SIGSTOP)
            try:
                replay.run(new_lines())
            finally:
                os.kill(proc.pid, signal.SIGCONT)
        stop_server(proc)
        replay.run(new_lines() + ([pending] if pending else []))
        return server_s, replay.seconds
    finally:
        trace_file.close()
        replay.close()
        if proc.poll() is None:
            stop_server(proc)


def run_serialized(path: Path, plan: list[list[str]], max_tokens: int, threads: int,
                   eog_ids: frozenset[int]) -> tuple[float, int]:
    from llama_cpp import Llama  # the baseline under test, not runner's own code

    llm = Llama(str(path), n_ctx=CTX_PER_SLOT, n_threads=threads, n_threads_batch=threads, verbose=False)
    eog = {t: -1e9 for t in eog_ids}  # like ignore_eos: every reply runs to max_tokens
    prompts = [p for client in plan for p in client]
    n_tokens = 0
    started = time.perf_counter()
    for prompt in prompts:
        out = llm.create_chat_completion([{"role": "user", "content": prompt}], max_tokens=max_tokens,
                                         temperature=0, logit_bias=eog)
        n_tokens += out["usage"]["completion_tokens"]
    elapsed = time.perf_counter() - started
    llm.close()
    return elapsed, n_tokens


def stat(fn, values: list[float]) -> float:
    """fn(values), or nan when a kind of run was skipped (--repeats 0, --interleaved 0)."""
    return float(fn(values)) if values else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="requests each client sends one after another")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=3, help="ours/ceiling pairs per concurrency (median taken)")
    ap.add_argument("--interleaved", type=int, default=2,
                    help="runs per concurrency with ours and its ceiling taking turns (see run_interleaved)")
    ap.add_argument("--slice-s", type=float, default=0.2,
                    help="length of a turn in the interleaved runs (shorter turns follow this VM's drift closer: "
                         "six runs at 1 client spread 0.86-0.99 with 1 s turns, 0.92-0.95 with 0.2 s)")
    ap.add_argument("--no-serialized", action="store_true", help="skip (b)")
    args = ap.parse_args()
    path = model_path(args.model)
    model = Model(path)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for c in args.concurrency:
            plan = requests_for(c, args.rounds)
            ours, ceiling, ratios, ttfts, outside = [], [], [], [], []
            for r in range(args.repeats):  # ours and its ceiling side by side, repeated: the median ratio
                trace = Path(tmp) / f"trace-{c}-{r}.jsonl"
                t_ours, n_ours, run_ttfts, n_warmup, decode_s = run_ours(args.model, c, plan, args.max_tokens,
                                                                         args.threads, trace)
                t_ceil = run_ceiling(model, c, trace, args.threads, n_warmup)
                ours.append(n_ours / t_ours)
                ceiling.append(n_ours / t_ceil)
                ratios.append(t_ceil / t_ours)
                outside.append(1 - decode_s / t_ours)
                ttfts += run_ttfts
                print(f"  c={c} run {r}: ours {ours[-1]:.1f} tok/s, ceiling {ceiling[-1]:.1f} tok/s", file=sys.stderr)
            turns = []
            for r in range(args.interleaved):
                trace = Path(tmp) / f"turns-{c}-{r}.jsonl"
                server_s, replay_s = run_interleaved(args.model, model, c, plan, args.max_tokens, args.threads, trace,
                                                     args.slice_s)
                turns.append(replay_s / server_s)
                print(f"  c={c} interleaved {r}: ours/ceiling {turns[-1]:.3f}", file=sys.stderr)
            if args.no_serialized:
                ser_tps = float("nan")
            else:
                t_ser, n_ser = run_serialized(path, plan, args.max_tokens, args.threads, model.eog_ids)
                ser_tps = n_ser / t_ser
            ours_tps = stat(np.median, ours)
            rows.append([c, c * args.rounds, ser_tps, ours_tps, stat(np.median, ceiling), ours_tps / ser_tps,
                         stat(np.median, ratios), stat(min, ratios), stat(np.median, turns), stat(min, turns),
                         stat(np.median, outside), stat(np.nanmean, ttfts), stat(np.nanmax, ttfts)])
    model.close()
    print(f"\nmodel {args.model}, {args.max_tokens} tokens per reply, {args.rounds} requests per client, "
          f"{args.threads} threads, greedy\n")
    print_table(
        ["clients", "requests", "serialized tok/s", "ours tok/s", "ceiling tok/s", "ours/serialized",
         "ours/ceiling (median of pairs)", "worst pair", "ours/ceiling (interleaved)", "worst interleaved",
         "outside llama_decode", "mean TTFT s", "max TTFT s"],
        rows,
    )


if __name__ == "__main__":
    main()
