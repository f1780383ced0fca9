"""Probes of what makes a token's logits differ cold and cached, on the real model (SmolLM2 Q4_1).

Measured here (max |cold - cached| over a prompt's last logits, 0 meaning identical):
- flash attention on (llama.cpp's default on CPUs) takes another path for a micro-batch of 64 or
  more rows than for fewer: a prompt's last token computed inside a long prefill chunk (cold)
  differs from the same token computed alone after its cached prefix (0.36-0.74 at 64-512 tokens);
- with every micro-batch under 64 rows, a lone last row still differs from one in a row of
  several at 257 tokens and more (0.49-0.58), and is identical once padded with a junk token;
- flash attention off is no cure: its matmul over the F16 KV differs for one row at 257-300
  tokens, and for rows of 2 and 5 (drafts) on an F16 model.
--batch-invariant on keeps micro-batches under 64 tokens and pads lone rows (the load probe finds
them different), so every row takes the same path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from runner.runtime.llama import Batch, Context, ContextShape, Model

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def smol(smollm2_path: Path):
    model = Model(smollm2_path)
    yield model
    model.close()


def last_logits_cold_and_cached(model: Model, token_ids: list[int], n_ubatch: int, split: int | None = None,
                                pad_last: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The prompt's last logits computed whole (chunks of the context's batch), and after its
    prefix was computed apart (in one row, or in chunks of `split`) with the last token alone, or
    with a junk token after it (pad_last, as micro_batches.pad does)."""
    ctx = Context(model, ContextShape(n_seq=2, n_ctx_per_seq=1024, n_batch=512, n_threads=2, kv_unified=False,
                                      n_ubatch_max=n_ubatch))
    try:
        batch = Batch(512)
        batch.add(0, token_ids, 0, 1)
        cold = ctx.decode(batch)[0].copy()
        prefix = token_ids[:-1]
        step = split or len(prefix)
        for start in range(0, len(prefix), step):
            batch.clear()
            batch.add(1, prefix[start:start + step], start, 0)
            ctx.decode(batch)
        batch.clear()
        last = token_ids[-1:] + (token_ids[:1] if pad_last else [])
        batch.add(1, last, len(prefix), len(last))
        cached = ctx.decode(batch)[0].copy()
        return cold, cached
    finally:
        ctx.close()


def prompt(model: Model, n: int) -> list[int]:
    text = " ".join(f"Item {i} on the list is a word about the weather and the sea." for i in range(n))
    return model.tokenize(text, add_special=True, parse_special=False)[:n]


@pytest.mark.parametrize("n_prompt", [64, 200, 257, 300, 500])
def test_micro_batches_under_64_rows_and_a_padded_last_row_end_a_prompt_the_same_cold_and_cached(
        smol: Model, n_prompt: int) -> None:
    cold, cached = last_logits_cold_and_cached(smol, prompt(smol, n_prompt), n_ubatch=63, pad_last=True)
    assert np.array_equal(cold, cached)


def test_with_small_micro_batches_chunk_boundaries_change_nothing(smol: Model) -> None:
    # the prefix in chunks of 48 (as a smaller --batch-size, or a step shared with other slots, cuts it)
    cold, cached = last_logits_cold_and_cached(smol, prompt(smol, 300), n_ubatch=63, split=48, pad_last=True)
    assert np.array_equal(cold, cached)


def test_short_prompts_agree_cold_and_cached_as_llama_cpp_runs_by_default(smol: Model) -> None:
    # under 64 rows and 257 positions every micro-batch takes the same path
    cold, cached = last_logits_cold_and_cached(smol, prompt(smol, 40), n_ubatch=512)
    assert np.array_equal(cold, cached)
