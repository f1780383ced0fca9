"""Probes of what makes a token's logits differ cold and cached, on the real model (SmolLM2 Q4_1).

Measured here (max |cold - cached| over the last logits, 0 meaning identical):
- flash attention on (llama.cpp's default on CPUs): its kernel takes another path for a
  micro-batch of 64 or more rows than for fewer, so a prompt's last token computed inside a long
  prefill chunk (cold) differs from the same token computed alone after its cached prefix
  (0.36-0.74 at 64-512 tokens);
- flash attention off: the attention's matmul over the F16 KV takes another path for one row than
  for several at some lengths (0.48-0.69 at 257-300 tokens, 0 at 64-256 and 400-512);
- flash attention off and the lone row padded with a junk token (what --batch-invariant on does):
  identical at every length, whatever the prefix's chunks."""

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


def last_logits_cold_and_cached(model: Model, flash_attn: str, token_ids: list[int], split: int | None = None,
                                pad_last: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The prompt's last logits computed whole (chunks of the context's batch), and after its
    prefix was computed apart (in one row, or in chunks of `split`) with the last token alone, or
    with a junk token after it (pad_last, as micro_batches.pad does)."""
    ctx = Context(model, ContextShape(n_seq=2, n_ctx_per_seq=1024, n_batch=512, n_threads=2, kv_unified=False,
                                      flash_attn=flash_attn))
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
def test_flash_attention_off_and_a_padded_last_row_end_a_prompt_the_same_cold_and_cached(
        smol: Model, n_prompt: int) -> None:
    cold, cached = last_logits_cold_and_cached(smol, "off", prompt(smol, n_prompt), pad_last=True)
    assert np.array_equal(cold, cached)


def test_with_the_last_row_padded_chunk_boundaries_change_nothing(smol: Model) -> None:
    # the prefix in chunks of 48 (as a smaller --batch-size, or a step shared with other slots, cuts it)
    cold, cached = last_logits_cold_and_cached(smol, "off", prompt(smol, 300), split=48, pad_last=True)
    assert np.array_equal(cold, cached)


def test_short_prompts_agree_cold_and_cached_whatever_the_kernel(smol: Model) -> None:
    # under 64 rows and 257 positions every micro-batch takes the same path, flash attention or not
    for flash_attn in ("on", "off"):
        cold, cached = last_logits_cold_and_cached(smol, flash_attn, prompt(smol, 40))
        assert np.array_equal(cold, cached)
