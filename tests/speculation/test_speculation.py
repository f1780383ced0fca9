"""Speculative decoding end to end on tiny GGUFs: lossless (greedy identical, sampling by the
rejection rule), draft model KV bookkeeping, vocabulary checks, the measured agreement."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from runner.model import loaded_model

from engines import load_tiny, submit_all, token_ids
from runner.sampling.constraints import GrammarSpec
from runner.core.errors import ModelLoadError
from runner.model.loaded_model import LoadedModel
from runner.config.options import EngineOptions
from runner.sampling.params import SamplingParams
from runner.scheduler.request import GenerationRequest, StreamEvent
from tiny_gguf import write_tiny_gguf

PROMPTS = [f"{w} the {x} in the {y}" for w in ("hello", "a b c", "the thin") for x in ("hat", "tree", "sea")
           for y in ("world", "thing", "end")][:24]


@pytest.fixture(scope="module")
def same_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("d") / "same.gguf", seed=0)  # the target's twin: accepts a lot


@pytest.fixture(scope="module")
def near_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("d") / "near.gguf", seed=0, perturb=0.1)  # agrees partly


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("d") / "other.gguf", seed=1)  # disagrees often


def run(loaded: LoadedModel, prompts: list[str], sampling: SamplingParams, max_tokens: int,
        speculate: list[bool] | None = None, seeds: list[int] | None = None) -> list[list[StreamEvent]]:
    return submit_all(loaded.engine, [
        GenerationRequest(f"r{i}", loaded.text_prompt_ids(text),
                          dataclasses.replace(sampling, seed=seeds[i]) if seeds else sampling, max_tokens,
                          ignore_eos=True, speculate=speculate[i] if speculate else True)
        for i, text in enumerate(prompts)])


@pytest.fixture(scope="module")
def plain(tiny_gguf: Path) -> dict[int, list[list[int]]]:
    loaded = load_tiny(tiny_gguf, 1)
    try:
        return {n: [token_ids(r) for r in run(loaded, PROMPTS, SamplingParams(temperature=0), n)] for n in (7, 33)}
    finally:
        loaded.close()


@pytest.mark.parametrize("parallel", [1, 4])
@pytest.mark.parametrize("drafter", ["ngram", "same", "other"])
def test_greedy_output_is_identical_to_plain_decoding(tiny_gguf: Path, same_draft: Path, other_draft: Path,
                                                       plain: dict[int, list[list[int]]], drafter: str,
                                                       parallel: int) -> None:
    draft = {"ngram": "ngram", "same": str(same_draft), "other": str(other_draft)}[drafter]
    loaded = load_tiny(tiny_gguf, parallel, draft=draft, spec="on", draft_max=4)
    try:
        for n in (7, 33):
            mixed = [i % 3 != 2 for i in range(len(PROMPTS))]  # every third request does not speculate
            results = run(loaded, PROMPTS, SamplingParams(temperature=0), n, mixed)
            assert [token_ids(r) for r in results] == plain[n]
            usage = [r[-1].usage for r in results]
            assert all(u.draft_proposed == 0 for u, m in zip(usage, mixed) if not m)
            assert sum(u.draft_proposed for u in usage) > 0
            accepted = sum(u.draft_accepted for u in usage)
            assert accepted == sum(d for r in results for e in r for d in e.drafted)
            if drafter == "same":
                assert accepted > 0.9 * sum(u.draft_proposed for u in usage)
    finally:
        loaded.close()


def chi2_critical(df: int, z: float = 2.326) -> float:
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def assert_same_distribution(a: Counter, b: Counter) -> None:
    """Two equal-sized samples of outcomes pass a chi-square test of one distribution (outcomes seen
    fewer than 10 times pooled), at the 1% level."""
    cats = [c for c in set(a) | set(b) if a[c] + b[c] >= 10]
    rest = ("rest",)
    ca = {c: a[c] for c in cats} | {rest: sum(v for k, v in a.items() if k not in cats)}
    cb = {c: b[c] for c in cats} | {rest: sum(v for k, v in b.items() if k not in cats)}
    chi2 = 0.0
    for c in ca:
        total = ca[c] + cb[c]
        if total:
            for obs in (ca[c], cb[c]):
                chi2 += (obs - total / 2) ** 2 / (total / 2)
    assert chi2 < chi2_critical(len(ca) - 1), (a.most_common(8), b.most_common(8))


def test_sampled_output_distribution_matches_plain_sampling(tiny_gguf: Path, near_draft: Path) -> None:
    params = dict(temperature=2.5, top_k=4, top_p=1.0, min_p=0.0)  # flat enough that drafts get rejected
    n_seeds = 600

    def pairs(loaded: LoadedModel, first_seed: int) -> Counter:
        # seeded (independent seeds per side): the test is a fixed sample, not a 1%-flaky one
        seeds = list(range(first_seed, first_seed + n_seeds))
        results = run(loaded, ["the thin"] * n_seeds, SamplingParams(**params), 3, seeds=seeds)
        # the first token comes from the prompt's row; tokens 2-3 pass through verification when drafting
        return Counter(tuple(token_ids(r)[1:3]) for r in results)

    plain_loaded = load_tiny(tiny_gguf, 8, max_queue=n_seeds)  # every request queued at once
    spec_loaded = load_tiny(tiny_gguf, 8, max_queue=n_seeds, draft=str(near_draft), spec="on", draft_max=3)
    try:
        for loaded in (plain_loaded, spec_loaded):
            for i, slot in enumerate(loaded.engine.scheduler.pool.slots):
                slot.last_used = i
        a, b = pairs(plain_loaded, 0), pairs(spec_loaded, 10_000)
        spec = spec_loaded.speculator
        assert 0.1 * spec.n_proposed < spec.n_accepted < 0.9 * spec.n_proposed  # both accepts and rejections
    finally:
        plain_loaded.close()
        spec_loaded.close()
    assert_same_distribution(a, b)


def test_kv_after_many_accept_reject_cycles_equals_a_fresh_prefill(tiny_gguf: Path, other_draft: Path) -> None:
    loaded = load_tiny(tiny_gguf, 2, draft=str(other_draft), spec="on", draft_max=4)
    try:
        results = run(loaded, PROMPTS[:2], SamplingParams(temperature=0), 120)
        assert all(r[-1].usage.draft_accepted > 0 for r in results)
        assert all(r[-1].usage.draft_accepted < r[-1].usage.draft_proposed for r in results)
        slot = loaded.engine.scheduler.pool.slots[0]
        ctx = loaded.runner.context
        assert ctx.kv_pos_max(slot.id) == slot.n_cached - 1
        from runner.runtime.llama import Batch

        batch = Batch(128)
        batch.add(slot.id, [7], slot.n_cached, 1)
        after_cycles = ctx.decode(batch)[0].copy()
        ctx.kv_remove(1, 0, -1)
        fresh_ids = slot.cached_ids + [7]
        for start in range(0, len(fresh_ids), 128):  # a fresh prefill of the same tokens in slot 1
            chunk = fresh_ids[start : start + 128]
            batch.clear()
            batch.add(1, chunk, start, 1 if start + len(chunk) == len(fresh_ids) else 0)
            logits = ctx.decode(batch)
        fresh = logits[0].copy()
    finally:
        loaded.close()
    assert int(np.argmax(after_cycles)) == int(np.argmax(fresh))
    assert np.abs(after_cycles - fresh).max() < 0.1  # same KV; only batch-shape rounding differs


def test_a_draft_with_another_vocabulary_is_refused(tiny_gguf: Path, tmp_path: Path) -> None:
    odd = write_tiny_gguf(tmp_path / "odd.gguf", extra_tokens=("zzz",))
    with pytest.raises(ModelLoadError, match=r"different vocabulary \(265 tokens\) from the target .* \(264 tokens\)"):
        load_tiny(tiny_gguf, 1, draft=str(odd), spec="on")


def test_a_draft_is_checked_from_its_header_before_its_weights_load(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    target = write_tiny_gguf(tmp_path / "target.gguf", extra_tokens=("yyy",))
    draft = write_tiny_gguf(tmp_path / "draft.gguf", extra_tokens=("zzz",))  # as many tokens, one other
    loaded_paths: list[str] = []
    real_model = loaded_model.Model

    def model(path: Path, *args: object, **kwargs: object) -> object:
        loaded_paths.append(Path(path).name)
        return real_model(path, *args, **kwargs)

    monkeypatch.setattr(loaded_model, "Model", model)
    with pytest.raises(ModelLoadError, match=r"as many tokens, 265, but not the same ones"):
        load_tiny(target, 1, draft=str(draft), spec="on")
    assert loaded_paths == ["target.gguf"]  # the draft's weights were never loaded


def test_spec_off_ignores_the_drafter(tiny_gguf: Path) -> None:
    loaded = load_tiny(tiny_gguf, 1, draft="ngram", spec="off")
    try:
        assert loaded.speculator is None
    finally:
        loaded.close()


def test_draft_model_kv_follows_a_prefix_copy(tiny_gguf: Path, same_draft: Path) -> None:
    system = "the thin thing in the hat " * 12
    loaded = load_tiny(tiny_gguf, 2, draft=str(same_draft), spec="on", draft_max=2)
    try:
        engine = loaded.engine
        busy: list[StreamEvent] = []
        engine.submit(GenerationRequest("busy", loaded.text_prompt_ids(system + "in the beginning"),
                                        SamplingParams(temperature=0), 60, ignore_eos=True), busy.append)
        for _ in range(3):
            engine.step()
        drafter = loaded.speculator.drafter
        warm_ids = loaded.text_prompt_ids(system + "zz top")
        engine.submit(GenerationRequest("warm", warm_ids, SamplingParams(temperature=0), 4, ignore_eos=True),
                      lambda e: None)
        engine.step()  # admission copies slot 0's KV (target and draft) into slot 1
        assert engine.scheduler.n_copied_prompt_tokens > 64
        slot = engine.scheduler.pool.slots[1]
        # the draft KV came along: only the prompt's own suffix (and what followed) is left to read
        assert drafter.catch_up_len(1, slot.cached_ids + [slot.next_token]) < len(warm_ids) - 64
        while engine.has_work:
            engine.step()
    finally:
        loaded.close()


def test_auto_starts_a_draft_model_from_its_measured_agreement(tiny_gguf: Path, same_draft: Path,
                                                               other_draft: Path, tmp_path: Path) -> None:
    """auto's first guess at a draft model's acceptance is how often its top token is the
    target's on a fixed text, measured once per pair and kept in the calibration file."""
    import json

    from runner.catalog.store import ModelStore
    from runner.runtime.calibration_cache import CALIBRATION_FILE
    from runner.speculation.speculator import PRIOR_ACCEPT

    def prior(draft: Path) -> float:
        opts = EngineOptions(parallel=1, ctx_size=256, batch_size=128, threads=2, draft=str(draft), spec="auto")
        loaded = LoadedModel(tiny_gguf, opts, store=ModelStore(root=tmp_path), log=lambda _: None)
        try:
            return loaded.speculator.prior_accept
        finally:
            loaded.close()

    assert prior(same_draft) == 1.0  # the twin's argmax is the target's at every position
    other = prior(other_draft)
    assert other != PRIOR_ACCEPT and 0.0 <= other < 0.5  # another random model mostly disagrees
    stored = {k: v for k, v in json.loads((tmp_path / CALIBRATION_FILE).read_text()).items() if ":agreement:" in k}
    assert sorted(stored.values()) == [other, 1.0]
    assert prior(other_draft) == other  # read back, not measured again


def test_greedy_with_logit_bias_is_identical_with_and_without_drafts(tiny_gguf: Path) -> None:
    plain, drafted = load_tiny(tiny_gguf, 1), load_tiny(tiny_gguf, 1, draft="ngram", spec="on", draft_max=4)
    try:
        first = run(plain, PROMPTS[:1], SamplingParams(temperature=0), 16)
        favourite = token_ids(first[0])[0]
        biased = SamplingParams(temperature=0, logit_bias=((favourite, -100.0),))
        want = [token_ids(r) for r in run(plain, PROMPTS[:8], biased, 48)]
        results = run(drafted, PROMPTS[:8], biased, 48)
    finally:
        plain.close()
        drafted.close()
    assert [token_ids(r) for r in results] == want
    assert all(favourite not in ids for ids in want)
    assert sum(r[-1].usage.draft_proposed for r in results) > 0  # drafts were verified under the bias


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "tags": {"type": "array", "items": {"enum": ["a", "bb"]}, "maxItems": 3}},
          "required": ["name", "tags"], "additionalProperties": False}


def constrained_run(loaded: LoadedModel, sampling: SamplingParams, n: int = 4) -> list[list[StreamEvent]]:
    spec = GrammarSpec("json_schema", json.dumps(SCHEMA), "response_format")
    return submit_all(loaded.engine, [
        GenerationRequest(f"c{i}", loaded.text_prompt_ids(text), dataclasses.replace(sampling, seed=i), 120,
                          constraint=loaded.compile_constraint(spec))
        for i, text in enumerate(PROMPTS[:n])])


@pytest.mark.parametrize("setup", ["ngram", "same", "other", "no jump-forward"])
def test_constrained_greedy_output_is_identical_with_and_without_drafts(tiny_gguf: Path, same_draft: Path,
                                                                       other_draft: Path, setup: str) -> None:
    plain = load_tiny(tiny_gguf, 2)
    options = {"no jump-forward": {"jump_forward": "off"}, "ngram": {"draft": "ngram", "spec": "on"},
               "same": {"draft": str(same_draft), "spec": "on"}, "other": {"draft": str(other_draft), "spec": "on"}}
    other = load_tiny(tiny_gguf, 2, **options[setup])
    try:
        want = constrained_run(plain, SamplingParams(temperature=0))
        got = constrained_run(other, SamplingParams(temperature=0))
        forced = plain.engine.stats.n_forced_tokens
    finally:
        plain.close()
        other.close()
    assert [token_ids(r) for r in got] == [token_ids(r) for r in want]
    assert forced > 0  # jump-forward ran in the plain engine
    for events in want:  # whatever the random model chose, it is the schema's JSON
        assert events[-1].finish_reason.value == "stop"
        jsonschema.validate(json.loads("".join(e.text for e in events)), SCHEMA)


def test_constrained_sampling_stays_inside_the_grammar_with_drafts(tiny_gguf: Path, near_draft: Path) -> None:
    loaded = load_tiny(tiny_gguf, 4, draft=str(near_draft), spec="on")
    try:
        results = constrained_run(loaded, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0), n=8)
    finally:
        loaded.close()
    for events in results:
        if events[-1].finish_reason.value == "stop":
            jsonschema.validate(json.loads("".join(e.text for e in events)), SCHEMA)
        else:  # out of tokens: still a prefix the grammar allows (checked as every token was taken)
            assert events[-1].finish_reason.value == "length"


def test_drafts_verified_past_a_stop_string_count_as_neither_accepted_nor_generated(tiny_gguf: Path,
                                                                                   same_draft: Path) -> None:
    """A step can verify drafts past the token that ends the reply (they were counted: usage said 8
    drafts accepted of an 8-token reply, and /metrics' generated tokens ran ahead of the reply's)."""
    loaded = load_tiny(tiny_gguf, 1, draft=str(same_draft), spec="on", draft_max=4)
    try:
        prompt_ids = loaded.text_prompt_ids("hello the hat in the world")
        (whole,) = submit_all(loaded.engine, [GenerationRequest("w", prompt_ids, SamplingParams(temperature=0), 24,
                                                                ignore_eos=True)])
        text = "".join(e.text for e in whole)
        stats = loaded.engine.stats
        for cut in (7, 9, 12):  # a stop string starting at several places in the reply
            stop = text[cut:cut + 3]
            before = stats.n_generated_tokens
            (events,) = submit_all(loaded.engine, [GenerationRequest("s", prompt_ids, SamplingParams(temperature=0),
                                                                     24, stop=(stop,), ignore_eos=True)])
            n_tokens = sum(len(e.token_ids) for e in events)
            assert "".join(e.text for e in events) == text[:text.index(stop)]
            assert events[-1].usage.draft_accepted == sum(d for e in events for d in e.drafted)
            assert events[-1].usage.draft_accepted < n_tokens == events[-1].usage.completion_tokens
            assert stats.n_generated_tokens - before == n_tokens
    finally:
        loaded.close()


def test_spec_on_without_a_drafter_is_refused_by_name(tiny_gguf: Path) -> None:
    """(it loaded and never drafted: no line, no draft counters)"""
    from runner.core.errors import OptionError

    with pytest.raises(OptionError, match=r"--spec on drafts every step: name a drafter with --draft"):
        load_tiny(tiny_gguf, 1, spec="on")


@pytest.mark.parametrize("drafter", ["ngram", "same", "near"])
def test_seeded_sampled_output_is_the_same_with_drafts_or_without(tiny_gguf: Path, same_draft: Path,
                                                                 near_draft: Path, drafter: str) -> None:
    """Every position's token is the target's own draw for it, whatever was drafted (by the rejection
    rule, a request's draws moved with how many drafts each step verified: same seed, another reply)."""
    sampling = SamplingParams(temperature=0.8)
    seeds = list(range(8))
    plain = load_tiny(tiny_gguf, 1)
    try:
        want = [token_ids(r) for r in run(plain, PROMPTS[:8], sampling, 24, seeds=seeds)]
    finally:
        plain.close()
    draft = {"ngram": "ngram", "same": str(same_draft), "near": str(near_draft)}[drafter]
    for draft_max in (2, 5):
        loaded = load_tiny(tiny_gguf, 2, draft=draft, spec="on", draft_max=draft_max)
        try:
            results = run(loaded, PROMPTS[:8], sampling, 24, seeds=seeds)
        finally:
            loaded.close()
        assert [token_ids(r) for r in results] == want
        assert sum(r[-1].usage.draft_accepted for r in results) > 0
