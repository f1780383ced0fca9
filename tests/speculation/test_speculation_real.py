"""Speculation on SmolLM2 with catalog variants as target/draft pairs, and n-gram lookup.

NOTE: with F16 weights llama.cpp's CPU kernels are not batch-invariant (a token decoded alone
differs from one in a wider batch by up to 0.03 in a logit): greedy identity under speculation is
guaranteed for quantized models always, and for F16/F32 with --batch-invariant on (the runner
pads one-token micro-batches, runtime/micro_batches.py). The F16 pairs below run with it on and
fail without it; the quantized ones run with the default (off)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.model.loaded_model import LoadedModel
from runner.config.options import EngineOptions
from runner.catalog.pull import pull
from runner.scheduler.request import GenerationRequest, StreamEvent
from runner.sampling.params import SamplingParams
from runner.catalog.store import ModelStore

pytestmark = pytest.mark.model
# 14 prompts: with 4 slots, three rounds of them queue behind each other (and every fourth does not draft)
TOPICS = ["the sea", "bread", "a lighthouse", "winter", "bees", "trains", "the moon", "tea", "rivers", "cats",
          "music", "gardens", "rain", "mountains"]
PROMPTS = [f"<|im_start|>user\nWrite two sentences about {t}.<|im_end|>\n<|im_start|>assistant\n" for t in TOPICS]


@pytest.fixture(scope="module")
def variants(smollm2_path: Path, model_cache: Path) -> dict[str, Path]:
    store = ModelStore(root=model_cache)
    paths = {v: pull(store.catalog.resolve(f"smollm2-135m-instruct:{v}"), store, quiet=True) for v in ("f16", "q8_0", "q4_0")}
    return {**paths, "q4_1": smollm2_path}


def generate(loaded: LoadedModel, max_tokens: int, speculate: list[bool]) -> list[list[int]]:
    results: list[list[StreamEvent]] = []
    for i, prompt in enumerate(PROMPTS):
        events: list[StreamEvent] = []
        ids = tuple(loaded.model.tokenize(prompt, add_special=False, parse_special=True))
        loaded.engine.submit(GenerationRequest(f"r{i}", ids, SamplingParams(temperature=0), max_tokens,
                                               speculate=speculate[i]), events.append)
        results.append(events)
    while loaded.engine.has_work:
        loaded.engine.step()
    return [[t for e in r for t in e.token_ids] for r in results]


def invariance(target: str) -> str:
    return "on" if target == "f16" else "off"  # quantized weights are batch-invariant as they are (these short prompts)


@pytest.fixture(scope="module")
def plain(variants: dict[str, Path]) -> dict[str, dict[int, list[list[int]]]]:
    out = {}
    for target in ("f16", "q8_0", "q4_1"):
        loaded = LoadedModel(variants[target], EngineOptions(parallel=1, ctx_size=512, batch_invariant=invariance(target)),
                             log=lambda _: None)
        try:
            # greedy and one sequence at a time: a 12-token reply is the first 12 tokens of the 40-token one
            longest = generate(loaded, 40, [False] * len(PROMPTS))
            out[target] = {40: longest, 12: [ids[:12] for ids in longest]}
        finally:
            loaded.close()
    return out


@pytest.mark.parametrize(("target", "draft", "parallel"), [
    ("f16", "q8_0", 1), ("f16", "q4_0", 4), ("f16", "ngram", 4),
    ("q8_0", "q4_0", 1), ("q8_0", "q4_0", 4), ("q4_1", "q8_0", 4), ("q8_0", "ngram", 4), ("q4_1", "ngram", 1),
])
def test_greedy_identity_with_speculation(variants: dict[str, Path], plain: dict[str, dict[int, list[list[int]]]],
                                          target: str, draft: str, parallel: int) -> None:
    drafter = "ngram" if draft == "ngram" else str(variants[draft])
    opts = EngineOptions(parallel=parallel, ctx_size=512, draft=drafter, spec="on", draft_max=4,
                         batch_invariant=invariance(target))
    loaded = LoadedModel(variants[target], opts, log=lambda _: None)
    try:
        mixed = [i % 4 != 3 for i in range(len(PROMPTS))]  # a quarter of the requests do not speculate
        for n in (12, 40):
            assert generate(loaded, n, mixed) == plain[target][n]
        spec = loaded.speculator
        assert spec.n_proposed > 0
        if draft != "ngram":
            assert spec.n_accepted > 0.25 * spec.n_proposed  # a same-family draft agrees often
    finally:
        loaded.close()


def test_catalog_target_names_its_default_draft(smollm2_path: Path, model_cache: Path) -> None:
    loaded = LoadedModel("smollm2-135m-instruct", EngineOptions(parallel=1, ctx_size=256, spec="on"),
                         store=ModelStore(root=model_cache), log=lambda _: None)
    try:
        assert loaded.speculator is not None and loaded.speculator.drafter.name == "draft-model"
        assert loaded.speculator.drafter.model.path.name == "SmolLM2-135M-Instruct.Q4_1.Q4_0.gguf"
    finally:
        loaded.close()
