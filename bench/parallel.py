"""Aggregate generated tokens/s under concurrency, three ways, side by side in one run:

  (a) ours:       `runner serve --parallel C`, C clients streaming over HTTP (bench/sse_clients.py);
  (b) serialized: the same requests one after another through llama-cpp-python's high-level `Llama`;
  (c) ceiling:    the exact batches our server decoded (recorded via RUNNER_BATCH_TRACE), replayed
                  through raw llama_decode + argmax with no server and no sampling.

    python bench/parallel.py [--concurrency 1 2 4 8 16] [--max-tokens 128] [--rounds 2]

Every request generates exactly --max-tokens tokens (end-of-text ignored), greedy.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import model_path, print_table  # noqa: E402
from sse_clients import run_clients  # noqa: E402

from runner.llama import Batch, Context, ContextShape, Model  # noqa: E402

PROMPTS = [
    "Explain how a bicycle works.", "Write a short poem about autumn.", "What causes rain?",
    "Describe the city of Paris.", "How do plants grow?", "Tell me about the history of tea.",
    "Why do cats purr?", "What is a computer?", "Describe a sunrise over the sea.", "How does a car engine work?",
    "What is the moon made of?", "Give advice for learning to cook.", "Describe a forest in winter.",
    "What do bees do all day?", "How are mountains formed?", "Write a letter to a friend.",
]
CTX_PER_SLOT = 1024
N_BATCH = 512


def requests_for(concurrency: int, rounds: int) -> list[list[str]]:
    """Per client, the prompts it sends one after another."""
    return [[PROMPTS[(c * rounds + r) % len(PROMPTS)] for r in range(rounds)] for c in range(concurrency)]


def run_ours(model: str, concurrency: int, plan: list[list[str]], max_tokens: int, threads: int,
             trace: Path) -> tuple[float, int, list[float], int, float]:
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
    # warm up (page in the weights, build the compute graphs) outside the timed part; the ceiling
    # replay skips the same number of decode steps untimed
    httpx.post(url + "/v1/chat/completions", timeout=60, json={"messages": [{"role": "user", "content": "Hi"}],
                                                                 "max_tokens": 8, "ignore_eos": True})
    metrics = httpx.get(url + "/metrics").text
    n_warmup_steps = int(re.search(r"^runner_steps_total (\d+)", metrics, re.M).group(1))
    bodies = [[{"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True} for prompt in prompts] for prompts in plan]
    load = run_clients(url, bodies)
    after = httpx.get(url + "/metrics").text
    decode_s = float(re.search(r"^runner_decode_seconds_total (\S+)", after, re.M).group(1)) - float(
        re.search(r"^runner_decode_seconds_total (\S+)", metrics, re.M).group(1))
    print(f"  ours: wall {load.elapsed_s:.3f} s, of which in llama_decode {decode_s:.3f} s", file=sys.stderr)
    proc.terminate()
    proc.wait(timeout=30)
    proc.stderr.close()
    return load.elapsed_s, load.n_tokens, load.ttfts, n_warmup_steps, decode_s


def run_ceiling(model: Model, concurrency: int, trace: Path, threads: int, n_warmup_steps: int) -> tuple[float, int]:
    ops = [json.loads(line) for line in trace.read_text().splitlines() if line]
    shape = ContextShape(concurrency, CTX_PER_SLOT, N_BATCH, threads, kv_unified=False, n_junk_max=concurrency)
    ctx = Context(model, shape)
    batch = Batch(shape.n_batch_max)
    n_sampled = 0
    n_decodes = 0
    try:
        started = time.perf_counter()
        for kind, args in ops:
            if n_decodes == n_warmup_steps:
                started, n_sampled = time.perf_counter(), 0
            if kind == "kv_remove":
                ctx.kv_remove(*args)
                continue
            if kind == "kv_copy_all":
                ctx.kv_copy(args[0], args[1], -1, -1)
                continue
            batch.clear()
            for seq_id, token_ids, first_pos, logit_offsets in args:
                start = batch.n_tokens
                batch.add(seq_id, token_ids, first_pos, 0)
                for offset in logit_offsets:
                    batch.set_logits(start + offset)
            logits = ctx.decode(batch)
            n_decodes += 1
            for row in logits:
                int(np.argmax(row))
            n_sampled += len(logits)
        return time.perf_counter() - started, n_sampled
    finally:
        ctx.close()


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="requests each client sends one after another")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeats", type=int, default=3, help="ours/ceiling pairs per concurrency (median taken)")
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
                t_ceil, _ = run_ceiling(model, c, trace, args.threads, n_warmup)
                ours.append(n_ours / t_ours)
                ceiling.append(n_ours / t_ceil)
                ratios.append(t_ceil / t_ours)
                outside.append(1 - decode_s / t_ours)
                ttfts += run_ttfts
                print(f"  c={c} run {r}: ours {ours[-1]:.1f} tok/s, ceiling {ceiling[-1]:.1f} tok/s", file=sys.stderr)
            if args.no_serialized:
                ser_tps = float("nan")
            else:
                t_ser, n_ser = run_serialized(path, plan, args.max_tokens, args.threads, model.eog_ids)
                ser_tps = n_ser / t_ser
            ours_tps = float(np.median(ours))
            rows.append([c, c * args.rounds, ser_tps, ours_tps, float(np.median(ceiling)), ours_tps / ser_tps,
                         float(np.median(ratios)), min(ratios), float(np.median(outside)), float(np.nanmean(ttfts)),
                         float(np.nanmax(ttfts))])
    model.close()
    print(f"\nmodel {args.model}, {args.max_tokens} tokens per reply, {args.rounds} requests per client, "
          f"{args.threads} threads, greedy\n")
    print_table(
        ["clients", "requests", "serialized tok/s", "ours tok/s", "ceiling tok/s", "ours/serialized",
         "ours/ceiling (median of pairs)", "worst pair", "outside llama_decode", "mean TTFT s", "max TTFT s"],
        rows,
    )


if __name__ == "__main__":
    main()
