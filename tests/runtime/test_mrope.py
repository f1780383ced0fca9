"""Images on an M-RoPE model (the Qwen2-VL family), on a tiny random qwen2vl and its merger projector
(tests/tiny_mrope.py): a 40x30 image is 12 tokens that advance positions by 4, and the text after it
continues there. The engine's reply equals a hand-made llama.cpp run at those positions, cold or with
the image's KV reused, with n-gram drafts rolled back, in either slot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engines import load_tiny, submit_all, token_ids
from runner.prompt.chat_template import Message, image_mark
from runner.runtime.llama import Batch, Context, ContextShape
from runner.sampling.params import SamplingParams
from runner.scheduler.request import GenerationRequest
from tiny_mmproj import png_bytes
from tiny_mrope import write_tiny_qwen2vl, write_tiny_qwen2vl_mmproj

PNG = png_bytes(40, 30, seed=1)
N_TOKENS, N_POS = 12, 4


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("mrope")
    return write_tiny_qwen2vl(root / "qwen2vl.gguf"), write_tiny_qwen2vl_mmproj(root / "mmproj-qwen2vl.gguf")


def request(loaded: Any, text: str, n: int = 10, request_id: str = "r") -> GenerationRequest:
    ids, spans = loaded.chat_prompt([Message("user", image_mark(0) + text)], None, [loaded.media_chunks(PNG)])
    return GenerationRequest(request_id, tuple(ids), SamplingParams(temperature=0), n, media=tuple(spans), ignore_eos=True)


def by_hand(loaded: Any, req: GenerationRequest, n: int) -> list[int]:
    """Greedy tokens from a fresh context: the text before the image, the image at its position, the
    text after at that position + the image's n_pos, then one token at a time."""
    (span,) = req.media
    shape = ContextShape(n_seq=1, n_ctx_per_seq=256, n_batch=128, n_threads=2, kv_unified=False)
    context = Context(loaded.model, shape)
    try:
        ids = list(req.prompt_ids)
        batch = Batch(128)
        batch.add(0, ids[: span.start], 0, 0)
        context.decode(batch)
        (image,) = loaded.media_chunks(PNG)
        pos = loaded.projector.decode(context, image, image.embeddings, 0, span.start)
        assert pos == span.start + N_POS and context.kv_pos_max(0) == span.start  # (every image cell at its first position)
        out, tail = [], ids[span.end :]
        for _ in range(n):
            batch.clear()
            batch.add(0, tail, pos, 1)
            token = int(np.argmax(context.decode(batch)[0]))
            out.append(token)
            pos, tail = pos + len(tail), [token]
        return out
    finally:
        context.close()


def test_text_after_an_image_continues_at_its_position_plus_n_pos(files: tuple[Path, Path]) -> None:
    loaded = load_tiny(files[0], 2, mmproj=str(files[1]))
    try:
        assert loaded.projector.uses_mrope
        (image,) = loaded.media_chunks(PNG)
        assert (image.n_tokens, image.n_pos) == (N_TOKENS, N_POS)
        req = request(loaded, "what is this?")
        expected = by_hand(loaded, req, 10)
        (cold,) = submit_all(loaded.engine, [req])
        assert token_ids(cold) == expected
        (span,) = req.media
        n_cached = len(req.prompt_ids) + 10 - 1  # (the last token is sampled, not yet in the KV)
        assert loaded.runner.context.kv_pos_max(0) == n_cached - (N_TOKENS - N_POS) - 1
        (again,) = submit_all(loaded.engine, [request(loaded, "what is this?", request_id="again")])
        assert token_ids(again) == expected  # the image's KV reused, positions as before
        assert again[-1].usage.cached_tokens >= span.end
        runner = loaded.runner  # removing from inside the span takes all of it (its cells sit at its start)
        slot = next(s for s in loaded.engine.scheduler.pool.slots if s.n_cached)
        assert runner.kv_remove(slot.id, span.start + 3)
        assert runner.context.kv_pos_max(slot.id) == span.start - 1 and runner._saved.get(slot.id) == []
    finally:
        loaded.close()


def test_ngram_drafts_rolled_back_past_an_image_keep_the_greedy_reply(files: tuple[Path, Path]) -> None:
    plain = load_tiny(files[0], 1, mmproj=str(files[1]))
    try:
        expected = [token_ids(r) for r in submit_all(plain.engine, [request(plain, t, 24, t) for t in ("a a a a", "the the")])]
    finally:
        plain.close()
    drafting = load_tiny(files[0], 2, mmproj=str(files[1]), draft="ngram", spec="on")
    try:
        results = submit_all(drafting.engine, [request(drafting, t, 24, t) for t in ("a a a a", "the the")])
        assert [token_ids(r) for r in results] == expected
        spec = drafting.speculator
        assert spec.n_proposed > spec.n_accepted  # (rejected drafts: KV removed past the image)
    finally:
        drafting.close()
