"""Soak a real `runner serve`: many concurrent streaming clients, a share that disconnect at random,
bad requests mixed in; then check nothing leaked and nothing changed.

Per round: --requests requests from --clients concurrent clients. Of the good ones (streamed chat,
random lengths), --disconnect of them drop the connection after a random number of chunks; about
one in ten requests is bad (invalid JSON, wrong content type, unknown model, a value out of range,
a body over the limit, a foreign Host) and must get its 4xx. After each round: every slot idle,
the queue empty; the server's threads, open fds and RSS are read from /proc. A greedy reply to a
fixed prompt is taken before the first round, during each and after the last: all identical.

    RUNNER_CACHE_DIR=.cache/models python bench/soak.py --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from common import print_table  # noqa: E402

URL_LINE = re.compile(r"on (http://127\.0\.0\.1:\d+)")
SERVED = "bench"  # the server is started with --alias bench
GREEDY = {"model": SERVED, "messages": [{"role": "user", "content": "Name three colours."}], "temperature": 0,
          "max_tokens": 32}
QUESTIONS = ["What is the capital of France?", "Count to ten.", "Say hello in Spanish.", "Name a planet.",
             "Write a haiku about the sea.", "What do bees make?", "Explain rain in one sentence."]
RSS_GROWTH_MAX = 0.10  # between the first and the last round
FD_GROWTH_MAX = 4  # between the first and the last round
THREADS_MAX_EXTRA = 40  # above the start: anyio's worker threads (templates, tokenizing) come and go up to its limit


@dataclass
class Tally:
    ok: int = 0
    disconnected: int = 0
    bad_refused: int = 0
    queue_full: int = 0
    unexpected: list[str] = field(default_factory=list)


def bad_request(url: str) -> tuple[dict, set[int]]:
    """(httpx.request kwargs, acceptable statuses) for one kind of bad input."""
    chat = url + "/v1/chat/completions"
    kind = random.randrange(6)
    if kind == 0:
        return {"content": b"{not json", "headers": {"Content-Type": "application/json"}, "url": chat}, {400}
    if kind == 1:
        return {"content": json.dumps(GREEDY).encode(), "headers": {"Content-Type": "text/plain"}, "url": chat}, {415}
    if kind == 2:
        return {"json": {**GREEDY, "model": "gpt-4o"}, "url": chat}, {404}
    if kind == 3:
        return {"json": {**GREEDY, "temperature": 9}, "url": chat}, {400}
    if kind == 4:
        big = {"model": SERVED, "messages": [{"role": "user", "content": "x" * 9_000_000}]}
        return {"json": big, "url": chat}, {413}
    return {"json": GREEDY, "headers": {"Host": "evil.example"}, "url": chat}, {403}


async def one_request(client: httpx.AsyncClient, url: str, tally: Tally, disconnect_share: float) -> None:
    if random.random() < 0.1:
        kwargs, allowed = bad_request(url)
        r = await client.request("POST", **kwargs)
        if r.status_code in allowed:
            tally.bad_refused += 1
        else:
            tally.unexpected.append(f"bad input got {r.status_code}: {r.text[:120]}")
        return
    body = {"model": SERVED, "messages": [{"role": "user", "content": random.choice(QUESTIONS)}], "stream": True,
            "max_tokens": random.randint(8, 96), "temperature": 0.8}
    leave_after = random.randint(1, 12) if random.random() < disconnect_share else None
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code == 503 and "queue_full" in (await r.aread()).decode():
            tally.queue_full += 1
            return
        if r.status_code != 200:
            tally.unexpected.append(f"{r.status_code}: {(await r.aread())[:120]!r}")
            return
        n = 0
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                n += 1
                if '"error"' in line and line.startswith('data: {"error"'):
                    tally.unexpected.append(f"stream error: {line[:120]}")
                    return
                if leave_after is not None and n >= leave_after:
                    tally.disconnected += 1
                    return  # leaving the block closes the connection mid-stream
    tally.ok += 1


async def greedy_reply(client: httpx.AsyncClient, url: str) -> str:
    r = await client.post(url + "/v1/chat/completions", json=GREEDY)
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"]


async def run_round(url: str, n_requests: int, n_clients: int, disconnect_share: float) -> tuple[Tally, str, float]:
    tally = Tally()
    pending = iter(range(n_requests))
    limits = httpx.Limits(max_connections=n_clients + 4, max_keepalive_connections=n_clients)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        async def worker() -> None:
            for _ in pending:
                try:
                    await one_request(client, url, tally, disconnect_share)
                except httpx.HTTPError as exc:
                    tally.unexpected.append(f"transport: {type(exc).__name__}: {exc}")

        started = time.perf_counter()
        workers = [asyncio.create_task(worker()) for _ in range(n_clients)]
        await asyncio.sleep(2.0)
        during = await greedy_reply(client, url)  # under full load
        await asyncio.gather(*workers)
        return tally, during, time.perf_counter() - started


def proc_stats(pid: int) -> dict[str, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    value = {}
    for line in status.splitlines():
        key, _, rest = line.partition(":")
        if rest.split():
            value[key] = rest.split()[0]
    return {"threads": int(value["Threads"]), "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "rss_mb": int(value["VmRSS"]) // 1024}


def idle_and_empty(url: str) -> tuple[bool, int]:
    deadline = time.time() + 30
    while True:
        slots = httpx.get(url + "/slots").json()
        metrics = httpx.get(url + "/metrics").text
        depth = int(next(ln.split()[1] for ln in metrics.splitlines() if ln.startswith("runner_queue_depth ")))
        if all(s["state"] == "idle" for s in slots) and depth == 0 or time.time() > deadline:
            return all(s["state"] == "idle" for s in slots), depth
        time.sleep(0.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=600, help="per round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--disconnect", type=float, default=0.3, help="share of good requests that leave mid-stream")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    random.seed(args.seed)
    server = subprocess.Popen([sys.executable, "-m", "runner", "serve", args.model, "--port", "0", "--parallel",
                               str(args.parallel), "--ctx-size", "1024", "--max-queue", str(args.clients),
                               "--max-body-mb", "8", "--alias", SERVED], stderr=subprocess.PIPE, text=True)
    try:
        assert server.stderr is not None
        url = None
        while url is None:
            line = server.stderr.readline()
            if not line:
                raise SystemExit("the server did not start")
            if match := URL_LINE.search(line):
                url = match.group(1)
        before = asyncio.run(_greedy(url))
        rows, stats = [], [("start", proc_stats(server.pid))]
        replies = [before]
        for i in range(args.rounds):
            tally, during, seconds = asyncio.run(run_round(url, args.requests, args.clients, args.disconnect))
            idle, depth = idle_and_empty(url)
            stats.append((f"round {i + 1}", proc_stats(server.pid)))
            replies.append(during)
            rows.append([i + 1, args.requests, tally.ok, tally.disconnected, tally.bad_refused, tally.queue_full,
                         len(tally.unexpected), "yes" if idle else "NO", depth, round(seconds, 1),
                         stats[-1][1]["threads"], stats[-1][1]["fds"], stats[-1][1]["rss_mb"]])
            for problem in tally.unexpected[:5]:
                print("unexpected:", problem)
        after = asyncio.run(_greedy(url))
        replies.append(after)
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(f"runner serve {args.model} --parallel {args.parallel}; {args.clients} clients, {args.disconnect:.0%} of "
          f"good requests disconnect; start: {stats[0][1]}")
    print_table(["round", "requests", "completed", "disconnected", "bad refused (4xx)", "queue full (503)",
                 "unexpected", "slots idle", "queue depth", "seconds", "threads", "fds", "RSS MB"], rows)
    first, last = stats[1][1], stats[-1][1]
    most_threads = max(s["threads"] for _, s in stats)
    growth_ok = (most_threads <= stats[0][1]["threads"] + THREADS_MAX_EXTRA and last["fds"] - first["fds"] <= FD_GROWTH_MAX
                 and last["rss_mb"] <= first["rss_mb"] * (1 + RSS_GROWTH_MAX))
    same = all(r == replies[0] for r in replies)
    print(f"\nthreads at most {most_threads} (bound: start + {THREADS_MAX_EXTRA}); from round 1 to {args.rounds}: fds "
          f"{last['fds'] - first['fds']:+d} (bound {FD_GROWTH_MAX}), RSS {last['rss_mb'] - first['rss_mb']:+d} MB "
          f"(bound {RSS_GROWTH_MAX:.0%}): {'ok' if growth_ok else 'EXCEEDED'}")
    print(f"greedy reply identical before, during each round and after: {'yes' if same else 'NO'} ({replies[0]!r})")
    failed = not growth_ok or not same or any(r[6] for r in rows) or any(r[7] != "yes" or r[8] for r in rows)
    sys.exit(1 if failed else 0)


async def _greedy(url: str) -> str:
    async with httpx.AsyncClient(timeout=120) as client:
        return await greedy_reply(client, url)


if __name__ == "__main__":
    main()
