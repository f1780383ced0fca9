"""Speculative decoding through the server: `runner serve` with a drafter against `--spec off`.

The same streaming clients (bench/sse_clients.py) send the same chat requests (greedy, end-of-text
ignored, every reply --max-tokens long) to two servers on the same model, one at a time, pair
after pair, alternating which goes first; each pair's ratio comes from the same minutes. What
bench/speculative.py measures inside the engine, this measures from outside, HTTP and streaming
included, with the server's defaults (auto, no batch padding) for every setting not named.

    python bench/speculative_http.py [--model smollm2-135m-instruct:f16] [--draft ngram|mtp|DRAFT] [--concurrency 1 4]

Workloads: free chat (open questions, every request different) and grounded (repeat or rewrite a
given text: the reply copies the prompt).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import CHAT_PROMPTS, model_path, print_table  # noqa: E402
from speculative import GROUNDED  # noqa: E402
from vs_llama_server import Shape, free_port, measure, ours_command  # noqa: E402

from runner.config.options import physical_cores  # noqa: E402

WORKLOADS = {"free chat": CHAT_PROMPTS, "grounded": GROUNDED}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct:f16")
    ap.add_argument("--draft", default="ngram", help="the drafter: 'ngram', a draft model's catalog name or .gguf "
                                                     "(an EAGLE3 head too), or 'mtp' (the model's own MTP layers)")
    ap.add_argument("--spec", default="auto")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2, help="requests each client sends one after another")
    ap.add_argument("--threads", type=int, default=physical_cores())
    ap.add_argument("--repeats", type=int, default=3, help="off/drafting pairs per cell (medians taken)")
    args = ap.parse_args()
    model = model_path(args.model)
    if args.draft not in ("ngram", "mtp"):
        model_path(args.draft)  # pulled before any timing
    drafting = ("--spec", args.spec) if args.draft == "mtp" else ("--draft", args.draft, "--spec", args.spec)
    settings = {"off": ("--spec", "off"), "drafting": drafting}
    rows = []
    for workload in args.workloads:
        for c in args.concurrency:
            shape = Shape(c, 1024, 512, args.threads)
            pairs = []
            for r in range(args.repeats):
                runs = {}
                for who in (("off", "drafting") if r % 2 == 0 else ("drafting", "off")):
                    port = free_port()
                    runs[who] = measure(ours_command(model, shape, port, settings[who]), port, c, args.rounds,
                                        args.max_tokens, prompts=WORKLOADS[workload])
                    print(f"  {workload} c={c} pair {r} {who}: {runs[who].tokens_per_s:.1f} tok/s, "
                          f"mean TTFT {runs[who].mean_ttft_s * 1000:.0f} ms", file=sys.stderr, flush=True)
                pairs.append(runs)
            ratios = [p["drafting"].tokens_per_s / p["off"].tokens_per_s for p in pairs]
            rows.append([workload, c, statistics.median(p["off"].tokens_per_s for p in pairs),
                         statistics.median(p["drafting"].tokens_per_s for p in pairs), statistics.median(ratios),
                         min(ratios),
                         statistics.median(p["drafting"].mean_ttft_s / p["off"].mean_ttft_s for p in pairs)])
    print(f"\nmodel {args.model}, --draft {args.draft} --spec {args.spec} against --spec off, {args.max_tokens} "
          f"tokens per reply, {args.rounds} requests per client, {args.threads} threads, greedy, "
          f"{args.repeats} pairs per row (medians)\n")
    print_table(["workload", "clients", "off tok/s", "drafting tok/s", "drafting/off (median)", "worst pair",
                 "TTFT drafting/off"], rows)


if __name__ == "__main__":
    main()
