"""Single-sequence decode speed: `runner`'s engine (Python API, as `runner run` uses it) vs a raw
llama_decode + argmax loop on the same model, interleaved in one run.

    python bench/decode_speed.py [--model smollm2-135m-instruct] [--tokens 128] [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import median, model_path, print_table  # noqa: E402

from runner.python_api.runner import Runner  # noqa: E402
from runner.runtime.llama import Batch, Context, ContextShape, Model  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper."


def raw_loop(model: Model, prompt_ids: list[int], n_tokens: int, threads: int) -> float:
    ctx = Context(model, ContextShape(1, 4096, 512, threads, kv_unified=False))
    batch = Batch(512)
    try:
        batch.add(0, prompt_ids, 0, 1)
        token = int(np.argmax(ctx.decode(batch)[0]))
        started = time.perf_counter()
        for i in range(n_tokens):
            batch.clear()
            batch.add(0, [token], len(prompt_ids) + i, 1)
            token = int(np.argmax(ctx.decode(batch)[0]))
        return n_tokens / (time.perf_counter() - started)
    finally:
        ctx.close()


def engine_loop(runner: Runner, prompt_ids: tuple[int, ...], n_tokens: int) -> float:
    runner.loaded.engine.scheduler.pool.slots[0].truncate(0)
    runner.loaded.runner.kv_remove(0)
    request = dataclasses.replace(runner.request(prompt_ids, max_tokens=n_tokens + 1, temperature=0), ignore_eos=True)
    started = None
    n = 0
    for event in runner.stream(request):
        if started is None:
            started = time.perf_counter()  # after the first token: decode only, like the raw loop
            continue
        n += len(event.token_ids)
    return n / (time.perf_counter() - started)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    path = model_path(args.model)
    runner = Runner(path, log=lambda _: None, threads=args.threads)
    prompt_ids = runner.loaded.text_prompt_ids(PROMPT)
    raw, ours = [], []
    for _ in range(args.repeats):
        raw.append(raw_loop(runner.loaded.model, list(prompt_ids), args.tokens, args.threads))
        ours.append(engine_loop(runner, prompt_ids, args.tokens))
    runner.close()
    print(f"model {args.model}, {args.tokens} tokens, median of {args.repeats} interleaved runs, {args.threads} threads\n")
    print_table(
        ["loop", "tok/s", "ratio vs raw"],
        [["raw llama_decode + argmax", median(raw), 1.0], ["runner engine (runner run)", median(ours), median(ours) / median(raw)]],
    )


if __name__ == "__main__":
    main()
