"""Drafting with a model's own MTP layers, on a tiny random glm4moe with one MTP layer: lossless at
1 and 4 slots, drafts proposed and counted, the MTP KV in step with what was accepted, drafts equal
to a fresh computation over the whole context, refusals in one line."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from engines import load_tiny, submit_all, token_ids
from runner.core.errors import ModelLoadError, OptionError
from runner.runtime import staging
from runner.runtime.llama import Batch, Context, ContextShape, Model
from runner.sampling.params import SamplingParams
from runner.scheduler.request import GenerationRequest
from test_speculation import chi2_critical
from tiny_mtp import write_tiny_mtp_gguf

PROMPTS = ["hello the cat", "a b c the tree", "the thin hat in the sea", "rain on the world"]


@pytest.fixture(scope="module")
def mtp_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_mtp_gguf(tmp_path_factory.mktemp("mtp") / "tiny-mtp.gguf")


def requests(loaded, n_tokens: int, sampling: SamplingParams | None = None) -> list[GenerationRequest]:  # type: ignore[no-untyped-def]
    return [GenerationRequest(f"r{i}", tuple(loaded.model.tokenize(p, add_special=False)),
                              sampling or SamplingParams(temperature=0), n_tokens) for i, p in enumerate(PROMPTS)]


@pytest.fixture(scope="module")
def agreeing_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_mtp_gguf(tmp_path_factory.mktemp("mtp") / "agreeing.gguf", agreeing=True)


@pytest.fixture(scope="module")
def plain_outputs(mtp_gguf: Path, agreeing_gguf: Path) -> dict[str, list[list[int]]]:
    out = {}
    for name, path in (("random", mtp_gguf), ("agreeing", agreeing_gguf)):
        loaded = load_tiny(path, 1, spec="off")
        try:
            assert loaded.speculator is None
            out[name] = [token_ids(e) for e in submit_all(loaded.engine, requests(loaded, 40))]
        finally:
            loaded.close()
    return out


@pytest.mark.parametrize(("weights", "parallel"), [("random", 1), ("random", 4), ("agreeing", 1), ("agreeing", 4)])
def test_greedy_output_with_mtp_drafts_is_the_plain_output(mtp_gguf: Path, agreeing_gguf: Path, weights: str,
                                                           plain_outputs: dict[str, list[list[int]]],
                                                           parallel: int) -> None:
    loaded = load_tiny(mtp_gguf if weights == "random" else agreeing_gguf, parallel, spec="mtp", draft_max=3)
    try:
        results = submit_all(loaded.engine, requests(loaded, 40))
        assert [token_ids(e) for e in results] == plain_outputs[weights]
        spec = loaded.speculator
        assert spec is not None and spec.drafter.name == "mtp"
        assert spec.n_accepted == sum(d for r in results for e in r for d in e.drafted)
        if weights == "random":
            assert spec.n_proposed >= 4 * 39 and spec.n_accepted <= 0.05 * spec.n_proposed  # drafted at every step (forced)
        else:  # drafts accepted (and rejected): fewer steps than tokens
            assert 0.3 * spec.n_proposed < spec.n_accepted < spec.n_proposed
        assert loaded.engine.snapshot().drafts.by_kind == (("mtp", spec.n_proposed, spec.n_accepted),)
    finally:
        loaded.close()


def test_a_model_with_mtp_layers_drafts_with_them_by_default_and_spec_off_loads_none(mtp_gguf: Path) -> None:
    loaded = load_tiny(mtp_gguf, 2)
    try:
        assert loaded.speculator is not None and loaded.speculator.drafter.name == "mtp"
        assert loaded.speculator.mode.value == "auto"
    finally:
        loaded.close()


def test_the_mtp_kv_holds_exactly_the_committed_tokens_after_every_step(mtp_gguf: Path) -> None:
    loaded = load_tiny(mtp_gguf, 2, spec="mtp", draft_max=4)
    try:
        drafter = loaded.speculator.drafter
        for i, request in enumerate(requests(loaded, 30)[:2]):
            loaded.engine.submit(request, lambda _: None)
        n_checked = 0
        while loaded.engine.has_work:
            loaded.engine.step()
            for slot in loaded.engine.scheduler.pool.slots:
                cached = drafter._cached.get(slot.id)
                if cached:  # fed with the target's rows: a prefix of what the target committed, nothing after
                    assert drafter.context.kv_pos_max(slot.id) == len(cached) - 1
                    assert cached == (slot.cached_ids + [slot.next_token])[: len(cached)]
                    n_checked += 1
        assert n_checked > 20 and loaded.speculator.n_proposed > loaded.speculator.n_accepted  # (rejections happened)
    finally:
        loaded.close()


def test_each_first_draft_is_what_a_fresh_mtp_pass_over_the_whole_context_gives(mtp_gguf: Path) -> None:
    """The drafter's rows line up: MTP position p is fed token p with the target's hidden row of p-1."""
    loaded = load_tiny(mtp_gguf, 2, spec="mtp", draft_max=2)
    seen: list[tuple[list[int], int]] = []
    drafter = loaded.speculator.drafter
    propose = drafter.propose

    def recording(jobs):  # type: ignore[no-untyped-def]
        propose(jobs)
        seen.extend((list(j.context_ids), j.draft_ids[0]) for j in jobs if j.draft_ids)

    drafter.propose = recording
    try:
        submit_all(loaded.engine, requests(loaded, 12)[:2])
    finally:
        loaded.close()
    model = Model(mtp_gguf, load_mtp=True)
    shape = ContextShape(n_seq=1, n_ctx_per_seq=256, n_batch=128, n_threads=2, kv_unified=False)
    target = Context(model, shape)
    target.capture_hidden()
    mtp = Context(model, shape, mtp_of=target)
    try:
        assert len(seen) > 10
        for context_ids, first_draft in seen[::3]:
            target.kv_remove(0)
            mtp.kv_remove(0)
            batch = Batch(128)
            batch.add(0, context_ids[:-1], 0, 0)
            target.decode(batch)
            hidden = target.hidden(len(context_ids) - 1)
            mtp_batch = Batch(128, model.n_embd_out)
            mtp_batch.add(0, context_ids, 0, 1, embd=np.vstack([np.zeros((1, model.n_embd_out)), hidden]))
            assert int(np.argmax(mtp.decode(mtp_batch)[0])) == first_draft
    finally:
        mtp.close()
        target.close()
        model.close()


def test_sampled_output_with_mtp_drafts_has_the_plain_distribution(agreeing_gguf: Path) -> None:
    params = SamplingParams(temperature=2.5, top_k=4, top_p=1.0, min_p=0.0)
    n_seeds = 600

    def pairs(loaded, first_seed: int):  # type: ignore[no-untyped-def]
        prompt = tuple(loaded.model.tokenize("the thin", add_special=False))
        results = submit_all(loaded.engine, [GenerationRequest(f"s{i}", prompt, dataclasses.replace(params, seed=first_seed + i), 3)
                                             for i in range(n_seeds)])
        return Counter(tuple(token_ids(r)[1:3]) for r in results)

    plain = load_tiny(agreeing_gguf, 8, spec="off", max_queue=n_seeds)
    drafted = load_tiny(agreeing_gguf, 8, spec="mtp", draft_max=2, max_queue=n_seeds)
    try:
        a, b = pairs(plain, 0), pairs(drafted, 10_000)
        spec = drafted.speculator
        assert 0.1 * spec.n_proposed < spec.n_accepted < 0.9 * spec.n_proposed  # both accepts and rejections
    finally:
        plain.close()
        drafted.close()
    cats = [c for c in set(a) | set(b) if a[c] + b[c] >= 10]
    ca = {c: a[c] for c in cats} | {("rest",): sum(v for k, v in a.items() if k not in cats)}
    cb = {c: b[c] for c in cats} | {("rest",): sum(v for k, v in b.items() if k not in cats)}
    chi2 = sum((obs - (ca[c] + cb[c]) / 2) ** 2 / ((ca[c] + cb[c]) / 2) for c in ca if ca[c] + cb[c] for obs in (ca[c], cb[c]))
    assert chi2 < chi2_critical(len(ca) - 1), (a.most_common(8), b.most_common(8))


def test_spec_mtp_on_a_model_without_mtp_layers_is_one_line(tiny_gguf: Path) -> None:
    with pytest.raises(OptionError) as refused:
        load_tiny(tiny_gguf, 1, spec="mtp")
    assert str(refused.value) == ("--spec mtp: tiny.gguf has no MTP layers (its GGUF sets no "
                                  "llama.nextn_predict_layers)")


def test_without_the_staging_calls_spec_mtp_is_refused_in_one_line_and_auto_drafts_otherwise(
        mtp_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(staging, "_library", lambda: object())  # a llama.cpp that exports none of them
    staging._find.cache_clear()
    try:
        with pytest.raises(ModelLoadError) as refused:
            load_tiny(mtp_gguf, 1, spec="mtp")
        message = str(refused.value)
        assert "\n" not in message and message.startswith(
            "--spec mtp needs llama.cpp's staging calls llama_set_embeddings_nextn, llama_get_embeddings_nextn,")
        loaded = load_tiny(mtp_gguf, 1, spec="auto")  # the model loads; it just does not draft with MTP
        try:
            assert loaded.speculator is None
        finally:
            loaded.close()
        loaded = load_tiny(mtp_gguf, 1, spec="auto", draft="ngram")
        try:
            assert loaded.speculator.drafter.name == "ngram"
            results = submit_all(loaded.engine, requests(loaded, 8))
            assert all(len(token_ids(r)) == 8 for r in results)
        finally:
            loaded.close()
    finally:
        staging._find.cache_clear()
