"""Time to first token with a ~1,000-token shared system prompt: cold vs warm, under load.

    python bench/prefix.py [--busy 1 4] [--repeats 3]

For each load level a server with (busy + 2) slots runs `busy` clients streaming long replies.
Then, per repeat, with a fresh system prompt (a nonce makes it unique):
  cold      the first request with that prompt (nothing reusable);
  warm-own  the next question lands on the idle slot that holds the prompt;
  warm-copy another request holds the prompt in a BUSY slot, and the question lands on a
            different slot, so the prefix is copied from the busy slot's KV.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from common import model_path, print_table  # noqa: E402

RULES = " ".join(f"Rule {i}: when asked about topic {i}, answer politely, briefly and truthfully." for i in range(1, 52))
COUNTING = "1, 2, 3, 4, 5, 6, 7,"


class Stream:
    def __init__(self, url: str, path: str, body: dict) -> None:
        self.sent = time.perf_counter()
        self._cm = httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=300)
        self._lines = self._cm.__enter__().iter_lines()
        self.ttft_s = None
        for line in self._lines:
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                choice = chunk["choices"][0] if chunk["choices"] else {}
                if choice.get("text") or (choice.get("delta") or {}).get("content"):
                    self.ttft_s = time.perf_counter() - self.sent
                    break

    def close(self) -> None:
        self._cm.__exit__(None, None, None)


SERVED = "bench"  # the servers here are started with --alias bench


def ask(url: str, system: str, question: str, max_tokens: int = 8, **extra: object) -> Stream:
    body = {"model": SERVED, "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": max_tokens, "temperature": 0, **extra}
    return Stream(url, "/v1/chat/completions", body)


def start_server(model: str, n_slots: int, threads: int) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner", "serve", model, "--port", "0", "--parallel", str(n_slots),
         "--ctx-size", "2048", "--threads", str(threads), "--alias", SERVED, "-q"], stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    while True:
        line = proc.stderr.readline()
        if not line:
            raise RuntimeError("server failed to start")
        match = re.search(r"(http://\S+)", line)
        if match:
            return proc, match.group(1)


def measure(model: str, n_busy: int, repeats: int, threads: int) -> dict[str, float]:
    proc, url = start_server(model, n_busy + 2, threads)
    times: dict[str, list[float]] = {"cold": [], "warm-own": [], "warm-copy": []}
    busy = [Stream(url, "/v1/completions", {"model": SERVED, "prompt": COUNTING, "max_tokens": 1900, "temperature": 0,
                                           "ignore_eos": True}) for _ in range(n_busy)]
    try:
        for r in range(repeats):
            system = f"Handbook edition {r}-{time.time_ns()}. {RULES}"
            cold = ask(url, system, "What is rule 3 about?")
            times["cold"].append(cold.ttft_s)
            cold.close()
            own = ask(url, system, "Summarise rule 10.")
            times["warm-own"].append(own.ttft_s)
            own.close()
            other = f"Handbook edition {r}b-{time.time_ns()}. {RULES}"
            holder = ask(url, other, "Write a long essay.", max_tokens=1500, ignore_eos=True)
            copy = ask(url, other, "Summarise rule 20.")
            times["warm-copy"].append(copy.ttft_s)
            copy.close()
            holder.close()
        metrics = httpx.get(url + "/metrics").text
        copied = int(re.search(r"^runner_prompt_tokens_copied_total (\d+)", metrics, re.M).group(1))
        assert copied > 0, "the warm-copy requests did not copy from the busy slot"
    finally:
        for s in busy:
            s.close()
        proc.terminate()
        proc.wait(timeout=30)
        proc.stderr.close()
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--busy", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    model_path(args.model)
    rows = []
    for n_busy in args.busy:
        t = measure(args.model, n_busy, args.repeats, args.threads)
        rows.append([n_busy, t["cold"], t["warm-own"], t["warm-copy"], t["cold"] / t["warm-own"],
                     t["cold"] / t["warm-copy"]])
        print(f"busy {n_busy}: {t}", file=sys.stderr, flush=True)
    print(f"\nmodel {args.model}, ~1,050-token system prompt, median TTFT of {args.repeats} repeats\n")
    print_table(["busy slots", "cold TTFT s", "warm (own slot) s", "warm (copied from busy slot) s",
                 "cold/warm own", "cold/warm copy"], rows)


if __name__ == "__main__":
    main()
