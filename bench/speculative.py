"""Speculative decoding: generated tokens/s against `--spec off`, measured in the same run.

    python bench/speculative.py [--target smollm2-135m-instruct:f16] [--concurrency 1 4 8] [--max-tokens 64]

Workloads: free chat (open questions), input-grounded (repeat / rewrite a given text, so the
output copies the prompt), repeating (40 requests from a few templates, whose replies repeat
across requests: what the n-gram store learns; each engine starts empty, so the first request
of each template has nothing to learn from) and `repeating, seen` (the same 40 after each engine,
off included, has served them once untimed: a server in steady state, its store holding every
template's reply and its slots' prompt caches as warm as off's). Drafter `ngram-local`: n-grams of the request's own
context only (`ngram` adds the store learned across requests). Modes: off (the fastest plain run: every ratio is against it); off with
batch padding (`--batch-invariant on`: what an F16 target gives up to stay batch-invariant, for
reference); each drafter forced on; each drafter with auto. All but the padded mode run with the
default `--batch-invariant off`.
Engine in-process (no HTTP), greedy, each request runs to --max-tokens. Each mode runs beside a
fresh `off` engine on the same requests, the two stepped in turn (see paired_run), so their ratio
does not carry the machine's drift between runs; each engine's rate covers all its requests.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import model_path, print_table  # noqa: E402

from runner.model.loaded_model import LoadedModel  # noqa: E402
from runner.config.options import EngineOptions  # noqa: E402
from runner.scheduler.request import GenerationRequest  # noqa: E402
from runner.sampling.params import SamplingParams  # noqa: E402

TEXT = ("The lighthouse keeper climbed the spiral stairs every evening at dusk. He wiped the great lens, "
        "trimmed the wick, and watched the ships pass beyond the rocks. In winter the storms came early, "
        "and the keeper wrote each one in his logbook: the date, the wind, the height of the waves.")
FREE = ["Write about the history of tea.", "Describe a walk in a forest.", "Explain how bees make honey.",
        "Tell me about the planet Mars.", "Write a short story about a clockmaker.", "Describe a busy market.",
        "Explain why the sky is blue.", "Write about a trip to the mountains."]
TEXT_WARMUP = ["Hi"]
GROUNDED = [f"Repeat the following text exactly, word for word:\n\n{TEXT}",
            f"Rewrite the following text, keeping every sentence:\n\n{TEXT}",
            f"Copy this paragraph:\n\n{TEXT}"]


PEOPLE = [("Alice", 31, "Lyon"), ("Bob", 42, "Leeds"), ("Chen", 27, "Taipei"), ("Dana", 55, "Austin"),
          ("Emil", 38, "Oslo"), ("Fatima", 23, "Rabat"), ("Goran", 61, "Split"), ("Hana", 45, "Osaka")]
FAQ = ["How do I reset my password?", "How do I change my email address?", "How do I delete my account?"]
CODE = "def area(width, height):\n    return width * height\n"
REPEATING = [  # what a server sees when its clients send the same kinds of requests again and again
    *[f"Return only a JSON object with the fields name, age and city for this person: {n}, {a}, {c}."
      for n, a, c in PEOPLE],
    *[f"Write a short, polite customer-support answer to: {q}" for q in FAQ],
    *[f"Add type hints and a docstring to this Python function, and show the whole function:\n\n"
      f"{CODE.replace('area', name)}" for name in ("area", "surface", "rect_area", "size")],
]


def prompts(workload: str, n: int) -> list[str]:
    """free chat and grounded: one request per client; repeating: 40 requests from a few templates
    (JSON records, support answers, the same code edited), `n` at a time in the engine's slots."""
    if workload.startswith("repeating"):
        return [REPEATING[(i * 7) % len(REPEATING)] for i in range(40)]
    base = FREE if workload == "free chat" else GROUNDED
    return [base[i % len(base)] for i in range(n)]


@dataclass
class Cell:
    """One engine's part of a paired run."""

    loaded: LoadedModel
    done: list = field(default_factory=list)
    busy_s: float = 0.0  # wall time of this engine's own steps inside the paired window
    n_tokens: int = 0  # tokens it generated inside the window
    n_runs_before: int = 0

    @property
    def tps(self) -> float:
        return self.n_tokens / self.busy_s

    def submit(self, texts: list[str], max_tokens: int, tag: str) -> None:
        from runner.prompt.chat_template import Message

        for i, text in enumerate(texts):
            ids = self.loaded.chat_prompt_ids([Message("user", text)])
            req = GenerationRequest(f"{tag}{i}", ids, SamplingParams(temperature=0), max_tokens, ignore_eos=True)
            self.loaded.engine.submit(req, lambda e, d=self.done: d.append(e) if e.is_final else None)

    def serve_untimed(self, texts: list[str], max_tokens: int) -> None:
        """Serve these requests to the end outside the measurement (nothing of them is counted)."""
        self.submit(texts, max_tokens, "seen")
        self.drain()
        self.done.clear()
        self.n_runs_before += self.n_runs

    def timed_step(self) -> None:
        engine = self.loaded.engine
        before = engine.stats.n_generated_tokens
        started = time.perf_counter()
        engine.step()
        self.busy_s += time.perf_counter() - started
        self.n_tokens += engine.stats.n_generated_tokens - before

    def drain(self) -> None:
        while self.loaded.engine.has_work:
            self.loaded.engine.step()

    @property
    def n_runs(self) -> int:
        speculator = self.loaded.speculator
        return (speculator.n_runs if speculator else 0) - self.n_runs_before


def load(target: Path, c: int, draft: str, spec: str, args: argparse.Namespace) -> Cell:
    invariant = "on" if spec == "padded" else "off"  # every ratio is against the fastest plain run
    store_mb = EngineOptions().ngram_store_mb
    if draft == "ngram-local":  # n-grams of the request's own context only: no store learned across requests
        draft, store_mb = "ngram", 0
    opts = EngineOptions(parallel=c, ctx_size=1024, threads=args.threads, draft=draft,
                         spec="off" if spec == "padded" else spec, draft_max=args.draft_max, batch_invariant=invariant,
                         ngram_store_mb=store_mb, max_queue=64)
    cell = Cell(LoadedModel(target, opts, log=lambda _: None))
    cell.submit(TEXT_WARMUP, 8, "w")  # warm-up (and calibration for auto, outside the timing)
    cell.drain()
    cell.done.clear()
    cell.n_runs_before = cell.n_runs
    return cell


def paired_run(off: Cell, other: Cell, texts: list[str], max_tokens: int) -> None:
    """Step the two engines in turn on the same requests, each timed on its own steps, to the end.

    The machine's speed drifts by several percent over seconds; taking turns step by step puts
    both engines in the same moments, so the ratio of their rates keeps only their own difference.
    Each rate covers its engine's whole run (prefill included): the one that finishes first steps
    on alone. (A window that closed when the first engine finished would cut the slower one's
    run to its prefill and a few decode steps, and make the faster one look up to twice as fast.)
    """
    off.submit(texts, max_tokens, "b")
    other.submit(texts, max_tokens, "b")
    while off.loaded.engine.has_work or other.loaded.engine.has_work:
        for cell in (off, other):
            if cell.loaded.engine.has_work:
                cell.timed_step()


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
    ap.add_argument("--skip-padded", action="store_true", help="leave out the `off padded` reference mode")
    args = ap.parse_args()
    target = model_path(args.target)
    for d in args.drafts:
        if d not in ("ngram", "ngram-local"):
            model_path(d)
    modes = [("off", "", "off")] + ([] if args.skip_padded else [("off padded", "", "padded")])
    modes += [(f"{d.split(':')[-1]} {m}", d, m) for d in args.drafts for m in args.spec]
    rows = []
    for workload in args.workloads:
        for c in args.concurrency:
            texts = prompts(workload, c)
            cells: dict[str, list[tuple[float, float, int, int, int]]] = {label: [] for label, _, _ in modes}
            ratios: dict[str, list[float]] = {label: [] for label in cells}
            others = modes[1:]
            for r in range(args.repeats):  # each mode against its own `off`, stepped in turn with it
                for label, draft, spec in others[r % len(others):] + others[: r % len(others)]:
                    off, other = load(target, c, "", "off", args), load(target, c, draft, spec, args)
                    try:
                        if workload == "repeating, seen":
                            for cell in (off, other):
                                cell.serve_untimed(texts, args.max_tokens)
                        paired_run(off, other, texts, args.max_tokens)
                    finally:
                        other.loaded.close()
                        off.loaded.close()
                    for name, cell in (("off", off), (label, other)):
                        cells[name].append((cell.tps, cell.n_tokens, sum(e.usage.draft_proposed for e in cell.done),
                                            sum(e.usage.draft_accepted for e in cell.done), cell.n_runs))
                    ratios[label].append(other.tps / off.tps)
                    print(f"  {workload} c={c} round {r} {label}: {ratios[label][-1]:.3f}x off "
                          f"({other.tps:.1f} vs {off.tps:.1f} tok/s), drafts {cells[label][-1][2]} proposed, "
                          f"{cells[label][-1][3]} accepted", file=sys.stderr, flush=True)
                    ratios["off"].append(1.0)
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
