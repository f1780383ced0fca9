"""Speculative decoding: generated tokens/s against `--spec off`, measured in the same run.

    python bench/speculative.py [--target smollm2-135m-instruct:f16] [--concurrency 1 4 8] [--max-tokens 64]

Workloads: free chat (open questions) and input-grounded (repeat / rewrite a given text, so the
output copies the prompt). Modes: off; off without batch padding (`--batch-invariant off`: the
speed an F16 target gives up to stay batch-invariant, for reference); each drafter forced on;
each drafter with auto.
Engine in-process (no HTTP), greedy, each request runs to --max-tokens.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import model_path, print_table  # noqa: E402

from runner.loaded_model import LoadedModel  # noqa: E402
from runner.options import EngineOptions  # noqa: E402
from runner.request import GenerationRequest  # noqa: E402
from runner.sampling import SamplingParams  # noqa: E402

TEXT = ("The lighthouse keeper climbed the spiral stairs every evening at dusk. He wiped the great lens, "
        "trimmed the wick, and watched the ships pass beyond the rocks. In winter the storms came early, "
        "and the keeper wrote each one in his logbook: the date, the wind, the height of the waves.")
FREE = ["Write about the history of tea.", "Describe a walk in a forest.", "Explain how bees make honey.",
        "Tell me about the planet Mars.", "Write a short story about a clockmaker.", "Describe a busy market.",
        "Explain why the sky is blue.", "Write about a trip to the mountains."]
GROUNDED = [f"Repeat the following text exactly, word for word:\n\n{TEXT}",
            f"Rewrite the following text, keeping every sentence:\n\n{TEXT}",
            f"Copy this paragraph:\n\n{TEXT}"]


def prompts(workload: str, n: int) -> list[str]:
    base = FREE if workload == "free chat" else GROUNDED
    return [base[i % len(base)] for i in range(n)]


def run_cell(loaded: LoadedModel, texts: list[str], max_tokens: int) -> tuple[float, int, int, int]:
    """Returns (tokens/s, tokens, drafts proposed, drafts accepted)."""
    from runner.chat_template import Message

    done = []
    for i, text in enumerate(texts):
        ids = loaded.chat_prompt_ids([Message("user", text)])
        req = GenerationRequest(f"b{i}", ids, SamplingParams(temperature=0), max_tokens, ignore_eos=True)
        loaded.engine.submit(req, lambda e, d=done: d.append(e) if e.is_final else None)
    started = time.perf_counter()
    while loaded.engine.has_work:
        loaded.engine.step()
    elapsed = time.perf_counter() - started
    n = sum(e.usage.completion_tokens for e in done)
    return n / elapsed, n, sum(e.usage.draft_proposed for e in done), sum(e.usage.draft_accepted for e in done)


def measure(target: Path, c: int, draft: str, spec: str, texts: list[str],
            args: argparse.Namespace) -> tuple[float, float, int, int, int]:
    """(tok/s, tokens, drafts proposed, accepted, draft runs) of one cell."""
    invariant = "off" if spec == "unpadded" else "auto"
    opts = EngineOptions(parallel=c, ctx_size=1024, threads=args.threads, draft=draft,
                         spec="off" if spec == "unpadded" else spec, draft_max=args.draft_max, batch_invariant=invariant)
    loaded = LoadedModel(target, opts, log=lambda _: None)
    try:
        run_cell(loaded, texts[:1], 8)  # warm-up (and calibration for auto, outside the timing)
        runs_before = loaded.speculator.n_runs if loaded.speculator else 0
        tps, n, proposed, accepted = run_cell(loaded, texts, args.max_tokens)
        n_runs = (loaded.speculator.n_runs if loaded.speculator else 0) - runs_before
    finally:
        loaded.close()
    return tps, n, proposed, accepted, n_runs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="smollm2-135m-instruct:f16")
    ap.add_argument("--drafts", nargs="+", default=["ngram", "smollm2-135m-instruct:q8_0", "smollm2-135m-instruct:q4_0"])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--draft-max", type=int, default=4)
    ap.add_argument("--spec", nargs="+", default=["on", "auto"], help="the --spec modes to run each drafter in")
    ap.add_argument("--workloads", nargs="+", default=["free chat", "grounded"])
    ap.add_argument("--repeats", type=int, default=3, help="rounds of all modes; ratios are medians over rounds")
    args = ap.parse_args()
    target = model_path(args.target)
    for d in args.drafts:
        if d != "ngram":
            model_path(d)
    modes = [("off", "", "off"), ("off unpadded", "", "unpadded")]
    modes += [(f"{d.split(':')[-1]} {m}", d, m) for d in args.drafts for m in args.spec]
    rows = []
    for workload in args.workloads:
        for c in args.concurrency:
            texts = prompts(workload, c)
            cells: dict[str, list[tuple[float, float, int, int, int]]] = {label: [] for label, _, _ in modes}
            for r in range(args.repeats):  # every mode once per round, so each ratio has its own `off`
                for label, draft, spec in modes[r % len(modes):] + modes[: r % len(modes)]:  # rotated: drift spreads
                    cells[label].append(measure(target, c, draft, spec, texts, args))
            ratios = {label: [] for label in cells}
            for r in range(args.repeats):
                for label in cells:
                    ratios[label].append(cells[label][r][0] / cells["off"][r][0])
            for label in cells:
                proposed = sum(x[2] for x in cells[label])
                accepted = sum(x[3] for x in cells[label])
                runs = sum(x[4] for x in cells[label])
                tps = statistics.median(x[0] for x in cells[label])
                rate = accepted / proposed if proposed else float("nan")
                mean_len = accepted / runs if runs else float("nan")
                rows.append([workload, c, label, tps, statistics.median(ratios[label]), min(ratios[label]), rate, mean_len])
                print(f"{workload} c={c} {label}: {tps:.1f} tok/s, median {statistics.median(ratios[label]):.2f}x off, "
                      f"acceptance {rate:.2f}", file=sys.stderr, flush=True)
    print(f"\ntarget {args.target}, {args.max_tokens} tokens per request, greedy, draft-max {args.draft_max}, "
          f"{args.threads} threads\n")
    print_table(["workload", "clients", "mode", "median tok/s", "vs off (median)", "vs off (worst round)",
                 "acceptance", "mean accepted length"], rows)


if __name__ == "__main__":
    main()
