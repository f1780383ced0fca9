"""Speculative decoding in the engine on tiny models: lossless, KV-consistent, vocab-checked."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from runner.errors import ModelLoadError
from runner.loaded_model import LoadedModel
from runner.options import EngineOptions
from runner.request import GenerationRequest, StreamEvent
from runner.sampling import SamplingParams
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


def load(path: Path, parallel: int, **spec: object) -> LoadedModel:
    opts = EngineOptions(parallel=parallel, ctx_size=256, batch_size=128, threads=2, **spec)
    return LoadedModel(path, opts, log=lambda _: None)


def run(loaded: LoadedModel, prompts: list[str], sampling: SamplingParams, max_tokens: int,
        speculate: list[bool] | None = None, seeds: list[int] | None = None) -> list[list[StreamEvent]]:
    out: list[list[StreamEvent]] = []
    for i, text in enumerate(prompts):
        events: list[StreamEvent] = []
        params = dataclasses.replace(sampling, seed=seeds[i]) if seeds else sampling
        loaded.engine.submit(GenerationRequest(f"r{i}", loaded.text_prompt_ids(text), params, max_tokens,
                                               ignore_eos=True, speculate=speculate[i] if speculate else True),
                             events.append)
        out.append(events)
    while loaded.engine.has_work:
        loaded.engine.step()
    return out


def tokens(events: list[StreamEvent]) -> list[int]:
    return [t for e in events for t in e.token_ids]


class WrongDrafter:
    """Always has a draft for every slot, never the right one (the fake model counts up): auto
    alone decides whether to use it, and using it never pays."""

    name, is_free = "wrong", True

    def __init__(self) -> None:
        self.n_calls = 0

    def propose(self, jobs) -> None:
        self.n_calls += 1
        for job in jobs:
            job.draft_ids, job.draft_dists = [49] * job.k, [None] * job.k

    def catch_up_len(self, slot_id, context_ids) -> int:
        return 0

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def plain(tiny_gguf: Path) -> dict[int, list[list[int]]]:
    loaded = load(tiny_gguf, 1)
    try:
        return {n: [tokens(r) for r in run(loaded, PROMPTS, SamplingParams(temperature=0), n)] for n in (7, 33)}
    finally:
        loaded.close()


@pytest.mark.parametrize("parallel", [1, 4])
@pytest.mark.parametrize("drafter", ["ngram", "same", "other"])
def test_greedy_output_is_identical_to_plain_decoding(tiny_gguf: Path, same_draft: Path, other_draft: Path,
                                                       plain: dict[int, list[list[int]]], drafter: str,
                                                       parallel: int) -> None:
    draft = {"ngram": "ngram", "same": str(same_draft), "other": str(other_draft)}[drafter]
    loaded = load(tiny_gguf, parallel, draft=draft, spec="on", draft_max=4)
    try:
        for n in (7, 33):
            mixed = [i % 3 != 2 for i in range(len(PROMPTS))]  # every third request does not speculate
            results = run(loaded, PROMPTS, SamplingParams(temperature=0), n, mixed)
            assert [tokens(r) for r in results] == plain[n]
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


def test_sampled_output_distribution_matches_plain_sampling(tiny_gguf: Path, near_draft: Path) -> None:
    params = dict(temperature=2.5, top_k=4, top_p=1.0, min_p=0.0)  # flat enough that drafts get rejected
    n_seeds = 600

    def pairs(loaded: LoadedModel, first_seed: int) -> Counter:
        # seeded (independent seeds per side): the test is a fixed sample, not a 1%-flaky one
        seeds = list(range(first_seed, first_seed + n_seeds))
        results = run(loaded, ["the thin"] * n_seeds, SamplingParams(**params), 3, seeds=seeds)
        # the first token comes from the prompt's row; tokens 2-3 pass through verification when drafting
        return Counter(tuple(tokens(r)[1:3]) for r in results)

    plain_loaded = load(tiny_gguf, 8)
    spec_loaded = load(tiny_gguf, 8, draft=str(near_draft), spec="on", draft_max=3)
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


def test_kv_after_many_accept_reject_cycles_equals_a_fresh_prefill(tiny_gguf: Path, other_draft: Path) -> None:
    loaded = load(tiny_gguf, 2, draft=str(other_draft), spec="on", draft_max=4)
    try:
        results = run(loaded, PROMPTS[:2], SamplingParams(temperature=0), 120)
        assert all(r[-1].usage.draft_accepted > 0 for r in results)
        assert all(r[-1].usage.draft_accepted < r[-1].usage.draft_proposed for r in results)
        slot = loaded.engine.scheduler.pool.slots[0]
        ctx = loaded.runner.context
        assert ctx.kv_pos_max(slot.id) == slot.n_cached - 1
        from runner.llama import Batch

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
        load(tiny_gguf, 1, draft=str(odd), spec="on")


def test_spec_off_ignores_the_drafter(tiny_gguf: Path) -> None:
    loaded = load(tiny_gguf, 1, draft="ngram", spec="off")
    try:
        assert loaded.speculator is None
    finally:
        loaded.close()


def test_auto_drafts_when_verification_is_cheap_and_not_when_it_is_not() -> None:
    from fake_runtime import FakeRuntime
    from runner.engine import Engine
    from runner.ngram_drafter import NgramDrafter
    from runner.scheduler import Scheduler
    from runner.speculator import SpecMode, Speculator
    from runner.step_costs import CostTable, ShapeCosts, StepCosts

    def auto_ks(table: CostTable) -> list[int]:
        rt = FakeRuntime()
        spec = Speculator(NgramDrafter(), SpecMode.AUTO, 4, 1, StepCosts(ShapeCosts({1: table})))
        engine = Engine(rt, Scheduler(1, 256, 64, 4, rt), rt, spec)
        # the fake model counts up, so a prompt that already counted up makes n-gram drafts that match
        engine.submit(GenerationRequest("a", tuple(list(range(1, 30)) + list(range(1, 5))), SamplingParams(temperature=0),
                                        20), lambda e: None)
        ks = []
        while engine.has_work:
            engine.step()
            ks.append(spec.slots[0].k)
        return ks

    flat = auto_ks(CostTable((1, 64), (0.010, 0.011)))  # verifying 5 tokens costs about one: draft all
    assert max(flat) == 4
    linear = auto_ks(CostTable((1, 64), (0.010, 0.640)))  # k tokens cost k times one: never pays
    assert max(linear) <= 1 and sum(linear) <= 2  # at most the exploration probe


def test_draft_model_kv_follows_a_prefix_copy(tiny_gguf: Path, same_draft: Path) -> None:
    system = "the thin thing in the hat " * 12
    loaded = load(tiny_gguf, 2, draft=str(same_draft), spec="on", draft_max=2)
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


def test_auto_probes_with_a_bounded_share_of_step_time() -> None:
    from fake_runtime import FakeRuntime
    from runner.engine import Engine
    from runner.scheduler import Scheduler
    from runner.speculator import EXPLORE_SHARE, SpecMode, Speculator
    from runner.step_costs import CostTable, ShapeCosts, StepCosts

    def run(two_tokens_s: float) -> tuple[int, int]:
        rt = FakeRuntime()
        costs = StepCosts(ShapeCosts({1: CostTable((1, 2, 64), (0.010, two_tokens_s, 0.640))}))
        spec = Speculator(WrongDrafter(), SpecMode.AUTO, 4, 1, costs)
        engine = Engine(rt, Scheduler(1, 1024, 64, 4, rt), rt, spec)
        engine.submit(GenerationRequest("a", (1, 2, 3), SamplingParams(temperature=0), 600, ignore_eos=True),
                      lambda e: None)
        n_steps = 0
        while engine.has_work:
            engine.step()
            n_steps += 1
        return spec.n_runs, n_steps

    probes, n_steps = run(0.014)  # a probe adds 40% to its step
    assert probes >= 3  # it keeps checking whether drafting has started to pay
    # within the budget, give or take one probe and the two drafts the prior makes before any record
    assert probes * 0.004 <= EXPLORE_SHARE * n_steps * 0.010 + 3 * 0.004
    assert run(0.040)[0] == 0  # a probe that costs 3 steps more: never


def test_auto_decides_again_only_every_few_steps_once_drafts_lost() -> None:
    """Once drafts were priced and lost, the same rows skip deciding (and proposing) for the next
    DECIDE_EVERY - 1 steps; a change of rows (a new request) decides at once."""
    from fake_runtime import FakeRuntime
    from runner.engine import Engine
    from runner.scheduler import Scheduler
    from runner.speculator import DECIDE_EVERY, SpecMode, Speculator
    from runner.step_costs import CostTable, ShapeCosts, StepCosts

    rt, drafter = FakeRuntime(), WrongDrafter()
    # k tokens cost k times one: drafts never pay, and probes (a whole step more) are never taken
    spec = Speculator(drafter, SpecMode.AUTO, 4, 2, StepCosts(ShapeCosts({1: CostTable((1, 64), (0.010, 0.640))})))
    engine = Engine(rt, Scheduler(2, 1024, 64, 4, rt), rt, spec)
    engine.submit(GenerationRequest("a", (1, 2, 3), SamplingParams(temperature=0), 40, ignore_eos=True),
                  lambda e: None)
    decided, n_steps = [], 0  # the steps that asked the drafter
    while engine.has_work:
        if n_steps == 20:
            engine.submit(GenerationRequest("b", (4, 5), SamplingParams(temperature=0), 5, ignore_eos=True),
                          lambda e: None)
        n_calls = drafter.n_calls
        engine.step()
        if drafter.n_calls > n_calls:
            decided.append(n_steps)
        n_steps += 1
    assert 20 in decided and 21 in decided  # request b's rows (its prefill, then its first token) decide at once
    alone = [s for s in decided if s < 20]
    assert alone == list(range(alone[0], 20, DECIDE_EVERY))  # one decision every DECIDE_EVERY steps


def test_auto_starts_a_draft_model_only_where_its_backlog_pays_back() -> None:
    """A draft model's KV starts empty: the first draft reads the whole prompt. Worth it for a long
    reply, not for a short one, even though drafting pays in steady state."""
    from fake_runtime import N_VOCAB, FakeRuntime
    from runner.engine import Engine
    from runner.scheduler import Scheduler
    from runner.speculator import SpecMode, Speculator
    from runner.step_costs import CostTable, ShapeCosts, StepCosts

    class RightDrafter:  # guesses the fake model's next tokens; remembers how much it has read
        name, is_free = "right", False

        def __init__(self) -> None:
            self.n_read = 0

        def propose(self, jobs) -> None:
            for job in jobs:
                self.n_read = len(job.context_ids)
                job.draft_ids = [(job.context_ids[-1] + 1 + i) % N_VOCAB for i in range(job.k)]
                job.draft_dists = [None] * job.k

        def catch_up_len(self, slot_id, context_ids) -> int:
            return len(context_ids) - self.n_read

        def close(self) -> None:
            pass

    def n_runs(max_tokens: int) -> int:
        rt = FakeRuntime()
        # verification nearly free, drafting 1 ms a token: pays in steady state; the 200-token
        # backlog costs ~0.2 s, which 5 tokens for the price of ~1.5 win back after ~30 tokens
        costs = StepCosts(ShapeCosts({1: CostTable((1, 5, 64), (0.010, 0.0105, 0.2))}),
                          ShapeCosts({1: CostTable((1, 64), (0.001, 0.064))}))
        spec = Speculator(RightDrafter(), SpecMode.AUTO, 4, 1, costs)
        engine = Engine(rt, Scheduler(1, 1024, 256, 4, rt), rt, spec)
        prompt = tuple(1 + i % (N_VOCAB - 1) for i in range(200))
        engine.submit(GenerationRequest("a", prompt, SamplingParams(temperature=0), max_tokens, ignore_eos=True),
                      lambda e: None)
        while engine.has_work:
            engine.step()
        return spec.n_runs

    assert n_runs(10) == 0
    assert n_runs(200) >= 30  # ~200 tokens at up to 5 a step


def test_auto_starts_a_draft_model_from_its_measured_agreement(tiny_gguf: Path, same_draft: Path,
                                                               other_draft: Path, tmp_path: Path) -> None:
    """auto's first guess at a draft model's acceptance is how often its top token is the
    target's on a fixed text, measured once per pair and kept in the calibration file."""
    import json

    from runner.speculator import PRIOR_ACCEPT
    from runner.step_costs import CALIBRATION_FILE
    from runner.store import ModelStore

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


def test_auto_counts_the_step_time_its_costs_leave_out() -> None:
    """Each step also spends time outside the priced llama_decode calls (sampling, streaming);
    drafting pays it once for several tokens. With it learned, drafts that the decode costs alone
    call a small loss are taken."""
    import time

    from fake_runtime import FakeRuntime
    from runner.engine import Engine
    from runner.ngram_drafter import NgramDrafter
    from runner.scheduler import Scheduler
    from runner.speculator import SpecMode, Speculator
    from runner.step_costs import CostTable, ShapeCosts, StepCosts

    class SlowRuntime(FakeRuntime):  # takes about the priced time per token, plus unpriced_s per step
        def __init__(self, unpriced_s: float) -> None:
            super().__init__()
            self.unpriced_s = unpriced_s

        def decode(self, rows):
            time.sleep(0.001 * sum(len(r.token_ids) for r in rows) + self.unpriced_s)
            return super().decode(rows)

    def drafted_share(unpriced_s: float) -> tuple[float, float]:
        rt = SlowRuntime(unpriced_s)
        # k tokens cost a bit more than k times one: even drafts that always land lose on these costs alone
        costs = StepCosts(ShapeCosts({1: CostTable((1, 64), (0.001, 0.066))}))
        spec = Speculator(NgramDrafter(), SpecMode.AUTO, 4, 1, costs)
        engine = Engine(rt, Scheduler(1, 256, 64, 4, rt), rt, spec)
        # the fake model counts up: the prompt already holds every continuation, so n-gram drafts land
        engine.submit(GenerationRequest("a", tuple(list(range(1, 50)) + list(range(1, 5))),
                                        SamplingParams(temperature=0), 40, ignore_eos=True), lambda e: None)
        while engine.has_work:
            engine.step()
        return spec.n_accepted / 40, spec.unpriced_s

    share, unpriced = drafted_share(0.004)
    assert unpriced > 0.002  # the sleep was learned (decode costs priced 1 ms a step)
    assert share > 0.5  # most tokens came as accepted drafts
    share, unpriced = drafted_share(0.0)
    assert share < 0.1  # at most the exploration probes


def test_calibration_is_measured_once_and_older_versions_are_dropped(tmp_path: Path) -> None:
    import json

    from runner.step_costs import CALIBRATION_FILE, CALIBRATION_VERSION, CostTable, ShapeCosts, cached_costs

    (tmp_path / CALIBRATION_FILE).write_text(json.dumps({"v0:old-model": {"1": {"sizes": [1], "seconds": [9.0]}}}))
    made = []

    def make() -> ShapeCosts:
        made.append(1)
        return ShapeCosts({1: CostTable((1, 2), (0.01, 0.015))})

    key = f"{CALIBRATION_VERSION}:model"
    first = cached_costs(tmp_path, key, make)
    again = cached_costs(tmp_path, key, make)
    assert made == [1] and again == first and again.micro_batch_s(1, 2) == 0.015
    assert list(json.loads((tmp_path / CALIBRATION_FILE).read_text())) == [key]
