"""What --batch-invariant on costs (flash attention off, lone rows padded: the same greedy output
cold or cached, alone or under load) against the default, in one run: decode tokens/s at 1 and 8
sequences, prefill tokens/s of a 2,000-token prompt, and the time to first token of a prompt whose
prefix is cached. Both engines are loaded side by side and take turns.

    RUNNER_CACHE_DIR=.cache/models python bench/batch_invariant.py [--model NAME] [--repeats 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import median, model_path, print_table  # noqa: E402

from runner.python_api.runner import Runner  # noqa: E402

SENTENCE = "Note {} says the tide came in early and the boats left the harbour before noon. "


def long_prompt(tag: int, n_sentences: int = 110) -> str:  # ~2,000 tokens, its own head each time
    return f"Log {tag}. " + "".join(SENTENCE.format(i) for i in range(n_sentences))


def decode_tok_s(r: Runner, n_seqs: int, n_tokens: int) -> float:
    engine = r.loaded.engine
    requests = [dataclasses.replace(r.request(r.loaded.text_prompt_ids(f"Story {i}:"), max_tokens=n_tokens,
                                              temperature=0), ignore_eos=True) for i in range(n_seqs)]
    for request in requests:
        engine.submit(request, lambda e: None)
    started = time.perf_counter()
    while engine.has_work:
        engine.step()
    return n_seqs * n_tokens / (time.perf_counter() - started)


def prefill_tok_s(r: Runner, tag: int) -> float:
    ids = r.loaded.text_prompt_ids(long_prompt(tag))
    started = time.perf_counter()
    r.stream(r.request(ids, max_tokens=1, temperature=0)).__next__()
    return len(ids) / (time.perf_counter() - started)


def cached_ttft_s(r: Runner, tag: int) -> float:
    """A prompt sent once, then again with a new last line: the second's time to first token."""
    text = long_prompt(tag, 50)
    "".join(e.text for e in r.stream(r.request(r.loaded.text_prompt_ids(text), max_tokens=1, temperature=0)))
    started = time.perf_counter()
    next(iter(r.stream(r.request(r.loaded.text_prompt_ids(text + "And then?"), max_tokens=1, temperature=0))))
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    path = model_path(args.model)
    runners = {mode: Runner(path, log=lambda _: None, parallel=8, ctx_size=2560, batch_invariant=mode)
               for mode in ("off", "on")}
    cases = {"decode tok/s, 1 sequence": lambda r, i: decode_tok_s(r, 1, args.tokens),
             "decode tok/s, 8 sequences": lambda r, i: decode_tok_s(r, 8, args.tokens),
             "prefill tok/s, 2,000-token prompt": prefill_tok_s,
             "TTFT s, ~900-token prefix cached": cached_ttft_s}
    rows = []
    for name, case in cases.items():
        seen: dict[str, list[float]] = {"off": [], "on": []}
        for i in range(args.repeats):
            for mode in (("off", "on") if i % 2 == 0 else ("on", "off")):
                seen[mode].append(case(runners[mode], 1000 * i + (mode == "on")))
        off, on = median(seen["off"]), median(seen["on"])
        ratio = off / on if name.startswith("TTFT") else on / off  # >1: on is better
        rows.append([name, round(off, 3), round(on, 3), round(ratio, 3)])
    for r in runners.values():
        r.close()
    print(f"\n{args.model}, median of {args.repeats} interleaved runs; ratio: on's speed over off's\n")
    print_table(["case", "default (off)", "--batch-invariant on", "on / off (speed)"], rows)


if __name__ == "__main__":
    main()
