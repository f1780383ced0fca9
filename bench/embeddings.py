"""Embedding throughput (inputs per second) at batch 1 and 32: runner's embedding context against
llama-cpp-python's own `Llama.embed` on the same model (mean pooling, normalized), in one run.

    RUNNER_CACHE_DIR=.cache/models python bench/embeddings.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import median, model_path, print_table  # noqa: E402

import llama_cpp  # noqa: E402
import numpy as np  # noqa: E402

from runner.model.loaded_model import LoadedModel  # noqa: E402
from runner.config.options import EngineOptions  # noqa: E402


def texts(n: int) -> list[str]:
    return [f"Sentence {i}: a short note about topic {i % 7} for retrieval, with a few more words." for i in range(n)]


def rate(embed, batch: int, n_inputs: int, repeats: int) -> float:
    """Median inputs per second embedding n_inputs texts `batch` at a time."""
    inputs = texts(n_inputs)
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        for i in range(0, n_inputs, batch):
            embed(inputs[i : i + batch])
        rates.append(n_inputs / (time.perf_counter() - started))
    return median(rates)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--inputs", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    path = model_path(args.model)
    loaded = LoadedModel(path, EngineOptions(parallel=1, ctx_size=512), log=lambda _: None)
    embedder = loaded.embedder()

    def ours(batch: list[str]) -> np.ndarray:
        return embedder.embed([loaded.embedding_ids(t) for t in batch])

    theirs_llm = llama_cpp.Llama(str(path), embedding=True, n_ctx=512, n_batch=512, n_ubatch=512,
                                 pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, n_threads=loaded.options.threads,
                                 flash_attn=True, verbose=False)

    def theirs(batch: list[str]) -> list:
        return theirs_llm.embed(batch, normalize=True)

    a, b = ours(texts(2)), np.array(theirs(texts(2)))
    agreement = float(np.min(np.sum(a * b, axis=1)))
    rows = []
    for batch in (1, 32):
        r_ours, r_theirs = rate(ours, batch, args.inputs, args.repeats), rate(theirs, batch, args.inputs, args.repeats)
        rows.append([batch, r_ours, r_theirs, r_ours / r_theirs])
    theirs_llm.close()
    loaded.close()
    print(f"{args.model}, {args.inputs} inputs of ~20 tokens, median of {args.repeats}; cosine(ours, theirs) >= "
          f"{agreement:.5f}")
    print_table(["batch", "runner inputs/s", "Llama.embed inputs/s", "runner / Llama.embed"], rows)


if __name__ == "__main__":
    main()
