"""Constrained decoding's cost, in one run: the same requests with and without a JSON schema, jump-forward
on and off, and the compile time of a large schema (cold and repeated).

- constrained / plain: tokens/s of requests constrained by a schema whose output never ends within
  max_tokens (an array of records) against the same requests unconstrained (ignore_eos), at each
  client count: the cost of computing and applying the masks;
- jump-forward: a schema of many fixed keys, one request at a time, time per reply with forced tokens
  decoded as drafts against without (the outputs must be identical);
- compile: a 50-field schema's first compile and a repeat (grammars are cached per schema).

    RUNNER_CACHE_DIR=.cache/models python bench/structured.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import model_path, print_table  # noqa: E402

from runner.prompt.chat_template import Message  # noqa: E402
from runner.sampling.constraints import GrammarSpec, grammar_text  # noqa: E402
from runner.model.loaded_model import LoadedModel  # noqa: E402
from runner.config.options import EngineOptions  # noqa: E402
from runner.sampling.params import SamplingParams  # noqa: E402
from runner.scheduler.request import GenerationRequest  # noqa: E402

RECORDS = {"type": "array", "minItems": 40, "items": {
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                     "age": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["name", "age"], "additionalProperties": False}}
FIXED_KEYS = {"type": "object", "properties": {f"is_the_{w}_setting_enabled_for_this_account": {"type": "boolean"}
                                               for w in ("first", "second", "third", "fourth", "fifth", "sixth")},
              "required": [f"is_the_{w}_setting_enabled_for_this_account"
                           for w in ("first", "second", "third", "fourth", "fifth", "sixth")],
              "additionalProperties": False}
WIDE = {"type": "object", "properties": {f"field_{i}": {"type": ["string", "integer", "boolean"]} for i in range(50)},
        "required": [f"field_{i}" for i in range(50)], "additionalProperties": False}


def spec(schema: dict) -> GrammarSpec:
    return GrammarSpec("json_schema", json.dumps(schema), "response_format")


def run(loaded: LoadedModel, prompt_ids: tuple[int, ...], n_clients: int, max_tokens: int, schema: dict | None,
        ignore_eos: bool) -> tuple[float, int, list[list[int]]]:
    """Submit n_clients requests at once, step until done: (seconds, tokens generated, each reply's ids)."""
    engine = loaded.engine
    outputs: list[list[int]] = [[] for _ in range(n_clients)]
    for i in range(n_clients):
        constraint = loaded.compile_constraint(spec(schema)) if schema is not None else None
        request = GenerationRequest(f"r{i}", prompt_ids, SamplingParams(temperature=0), max_tokens,
                                    stop=loaded.template.stop, ignore_eos=ignore_eos, constraint=constraint)
        engine.submit(request, lambda e, out=outputs[i]: out.extend(e.token_ids))
    started = time.perf_counter()
    while engine.has_work:
        engine.step()
    return time.perf_counter() - started, sum(map(len, outputs)), outputs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="rounds; ratios are medians over rounds")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    options = EngineOptions(parallel=max(args.concurrency), ctx_size=1024, threads=args.threads)
    loaded = LoadedModel(model_path(args.model), options, log=lambda _: None)
    try:
        started = time.perf_counter()
        loaded.model.guidance_tokenizer  # noqa: B018 - built once per model; timed on its own
        tokenizer_s = time.perf_counter() - started
        prompt = loaded.chat_prompt_ids([Message("user", "List people with their names and ages as JSON.")])
        rows = []
        for n in args.concurrency:
            for jump in (False, True):
                loaded.engine.jump_forward = jump
                ratios, tps = [], {"plain": [], "constrained": []}
                for _ in range(args.repeats):  # in turns: the machine's drift hits both alike
                    plain_s, plain_n, _ = run(loaded, prompt, n, args.max_tokens, None, ignore_eos=True)
                    cons_s, cons_n, _ = run(loaded, prompt, n, args.max_tokens, RECORDS, ignore_eos=False)
                    tps["plain"].append(plain_n / plain_s)
                    tps["constrained"].append(cons_n / cons_s)
                    ratios.append((cons_n / cons_s) / (plain_n / plain_s))
                rows.append([f"constrained vs plain, {n} client{'s' * (n > 1)}, jump-forward {'on' if jump else 'off'}",
                             round(statistics.median(tps["plain"]), 1), round(statistics.median(tps["constrained"]), 1),
                             round(statistics.median(ratios), 3), round(min(ratios), 3)])
        jump_ratios, same = [], True
        for _ in range(args.repeats):
            loaded.engine.jump_forward = False
            off_s, _, off_out = run(loaded, prompt, 1, 200, FIXED_KEYS, ignore_eos=False)
            loaded.engine.jump_forward = True
            on_s, _, on_out = run(loaded, prompt, 1, 200, FIXED_KEYS, ignore_eos=False)
            same = same and on_out == off_out
            jump_ratios.append(off_s / on_s)
        rows.append([f"jump-forward on vs off (6 fixed keys), output identical: {'yes' if same else 'NO'}",
                     round(len(on_out[0]) / off_s, 1), round(len(on_out[0]) / on_s, 1),
                     round(statistics.median(jump_ratios), 3), round(min(jump_ratios), 3)])
        print_table(["case", "baseline tok/s", "tok/s", "ratio (median)", "worst round"], rows)
        grammar_text.cache_clear()
        started = time.perf_counter()
        loaded.compile_constraint(spec(WIDE))
        cold_ms = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        loaded.compile_constraint(spec(WIDE))
        warm_ms = (time.perf_counter() - started) * 1000
        print(f"\ncompile, 50-field schema: {cold_ms:.1f} ms the first time, {warm_ms:.1f} ms repeated (cached "
              f"grammar; a fresh matcher per request); the model's llguidance tokenizer: {tokenizer_s:.2f} s once")
    finally:
        loaded.close()


if __name__ == "__main__":
    main()
