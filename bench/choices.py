"""n choices against separate requests of the same prompt, in one run.

- n=4: one request for four choices (the prompt computed once, the other choices forked from its KV);
- 4 at once: four separate requests submitted together (each prefills the prompt; the fastest plain way);
- 4 in turn: four separate requests one after another (the second and later reuse the prompt's KV
  from the prefix cache).
Same sampling (temperature 0.8, seeds), same max_tokens, ignore_eos: the same tokens are generated.

    RUNNER_CACHE_DIR=.cache/models python bench/choices.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import median, model_path, print_table  # noqa: E402

from runner.model.loaded_model import LoadedModel  # noqa: E402
from runner.config.options import EngineOptions  # noqa: E402
from runner.sampling.params import SamplingParams  # noqa: E402
from runner.scheduler.request import GenerationRequest  # noqa: E402

N = 4


def requests(prompt_ids: tuple[int, ...], max_tokens: int, tag: str) -> list[GenerationRequest]:
    return [GenerationRequest(f"{tag}{i}", prompt_ids, SamplingParams(temperature=0.8, seed=100 + i), max_tokens,
                              ignore_eos=True) for i in range(N)]


def forget(loaded: LoadedModel) -> None:
    """Empty every slot: each way starts cold."""
    for slot in loaded.engine.scheduler.pool.slots:
        slot.truncate(0)
        loaded.runner.kv_remove(slot.id, 0, -1)


def drain(loaded: LoadedModel) -> None:
    while loaded.engine.has_work:
        loaded.engine.step()


def run(loaded: LoadedModel, way: str, prompt_ids: tuple[int, ...], max_tokens: int) -> float:
    forget(loaded)
    batch = requests(prompt_ids, max_tokens, way)
    started = time.perf_counter()
    if way == "n=4":
        loaded.engine.submit_group(batch, [lambda e: None] * N)
        drain(loaded)
    elif way == "4 at once":
        for request in batch:
            loaded.engine.submit(request, lambda e: None)
        drain(loaded)
    else:
        for request in batch:
            loaded.engine.submit(request, lambda e: None)
            drain(loaded)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    loaded = LoadedModel(model_path(args.model), EngineOptions(parallel=N, ctx_size=2048), log=lambda _: None)
    words = ("the quick brown fox jumps over the lazy dog while seven wizards quietly judge boxing matches " * 200)
    prompt_ids = loaded.text_prompt_ids(words)[: args.prompt_tokens]
    ways = ["n=4", "4 at once", "4 in turn"]
    times = {w: [] for w in ways}
    for _ in range(args.repeats):
        for way in ways:
            times[way].append(run(loaded, way, prompt_ids, args.max_tokens))
    loaded.close()
    base = median(times["4 at once"])
    print(f"{args.model}, prompt {len(prompt_ids)} tokens, {N} x {args.max_tokens} tokens, median of {args.repeats}")
    print_table(["way", "seconds", "vs 4 at once", "vs 4 in turn"],
                [[w, median(times[w]), median(times[w]) / base, median(times[w]) / median(times["4 in turn"])]
                 for w in ways])


if __name__ == "__main__":
    main()
