"""The speculator's auto mode on the scripted fake runtime: which ks it takes, when it probes,
rests and starts a draft model. Step times come from an injected clock where they matter."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from engines import fake_engine
from fake_runtime import N_VOCAB, FakeRuntime
from runner.sampling.params import SamplingParams
from runner.scheduler.request import GenerationRequest
from runner.scheduler.slots import SlotState
from runner.speculation.auto_policy import DECIDE_EVERY, EXPLORE_SHARE, UnpricedTime
from runner.speculation.cost_model import CostTable, ShapeCosts, StepCosts
from runner.speculation.ngram_drafter import NgramDrafter
from runner.speculation.speculator import SpecMode, Speculator


class WrongDrafter:
    """Always has a draft for every slot, never the right one (the fake model counts up): auto
    alone decides whether to use it, and using it never pays."""

    name, is_free = "wrong", True

    def __init__(self) -> None:
        self.n_calls = 0

    def propose(self, jobs) -> None:
        self.n_calls += 1
        for job in jobs:
            job.draft_ids = [49] * job.k

    def catch_up_len(self, slot_id, context_ids) -> int:
        return 0

    def close(self) -> None:
        pass


class RightDrafter:
    """A draft model that guesses the fake model's next tokens (it counts up) and remembers how
    much of each slot's context it has read (its backlog is the rest)."""

    name, is_free = "right", False

    def __init__(self) -> None:
        self.n_read: dict[int, int] = {}
        self.n_jobs = 0

    def propose(self, jobs) -> None:
        self.n_jobs += len(jobs)
        for job in jobs:
            self.n_read[job.slot_id] = len(job.context_ids)
            job.draft_ids = [(job.context_ids[-1] + 1 + i) % N_VOCAB for i in range(job.k)]

    def catch_up_len(self, slot_id, context_ids) -> int:
        return len(context_ids) - self.n_read.get(slot_id, 0)

    def close(self) -> None:
        pass


class CountingDrafter(WrongDrafter):
    """Free, always right (the fake model counts up), with no estimate of its own acceptance."""

    name = "counting"

    def propose(self, jobs) -> None:
        for job in jobs:
            job.draft_ids = [(job.context_ids[-1] + 1 + i) % N_VOCAB for i in range(job.k)]


class ClockedRuntime(FakeRuntime):
    """The fake runtime with a clock that each decode moves on by step_s(rows)."""

    def __init__(self, step_s: Callable[[list], float]) -> None:
        super().__init__()
        self.step_s = step_s
        self.now_s = 0.0

    def clock(self) -> float:
        return self.now_s

    def decode(self, rows):
        self.now_s += self.step_s(rows)
        return super().decode(rows)


def test_auto_drafts_when_verification_is_cheap_and_not_when_it_is_not() -> None:
    def auto_ks(table: CostTable) -> list[int]:
        rt = FakeRuntime()
        spec = Speculator(NgramDrafter(), SpecMode.AUTO, 4, 1, StepCosts(ShapeCosts({1: table})))
        engine, _ = fake_engine(1, 256, 64, speculator=spec, runtime=rt)
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


def test_auto_probes_with_a_bounded_share_of_step_time() -> None:
    def run(two_tokens_s: float) -> tuple[int, int]:
        rt = FakeRuntime()
        costs = StepCosts(ShapeCosts({1: CostTable((1, 2, 64), (0.010, two_tokens_s, 0.640))}))
        spec = Speculator(WrongDrafter(), SpecMode.AUTO, 4, 1, costs)
        engine, _ = fake_engine(1, 1024, 64, speculator=spec, runtime=rt)
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


def counting_run(costs: StepCosts) -> Speculator:
    """A 400-token greedy reply with an always-right free drafter under auto, from a 0.3 prior."""
    spec = Speculator(CountingDrafter(), SpecMode.AUTO, 4, 1, costs, prior_accept=0.3)
    engine, _ = fake_engine(1, 1024, 64, speculator=spec)
    engine.submit(GenerationRequest("a", (1, 2, 3), SamplingParams(temperature=0), 400, ignore_eos=True),
                  lambda e: None)
    while engine.has_work:
        engine.step()
    return spec


def test_auto_learns_a_drafter_pays_where_one_draft_is_dear_and_four_are_cheap() -> None:
    """One row on F16 weights on this CPU: 9.6 ms for a token, 16.5 for two, 18.2 for five. With
    the prior's acceptance nothing pays, and a one-draft probe was too dear to take: a drafter that
    is always right never drafted. Measured (probes of four drafts, the proposals it did not
    draft), it drafts."""
    spec = counting_run(StepCosts(ShapeCosts({1: CostTable((1, 2, 5, 64), (0.0096, 0.0165, 0.0182, 0.200))})))
    assert spec.n_accepted > 150


def test_auto_learns_a_free_drafters_acceptance_from_proposals_it_did_not_draft() -> None:
    """Four drafts of an always-right drafter pay (5 tokens for 3.2 steps' time), but at the prior's
    acceptance they do not, and no probe is affordable (each draft adds over half a step). Its
    proposals, scored against the tokens the target then generates, show it is right: it drafts.
    What /metrics and usage count stays the drafts actually verified."""
    spec = counting_run(StepCosts(ShapeCosts({1: CostTable((1, 2, 5, 64), (0.010, 0.025, 0.032, 0.300))})))
    assert spec.n_accepted > 300
    verified, estimated = spec.records[None], spec.estimates[None]
    assert sum(verified.accepted) == spec.n_accepted  # every verified draft was right
    assert sum(estimated.proposed) > sum(verified.proposed)  # ... and the scored proposals came first


def test_auto_decides_again_only_every_few_steps_once_drafts_lost() -> None:
    """Once drafts were priced and lost, the same rows skip deciding (and proposing) for the next
    DECIDE_EVERY - 1 steps; a change of rows (a new request) decides at once."""
    rt, drafter = FakeRuntime(), WrongDrafter()
    # k tokens cost k times one: drafts never pay, and probes (a whole step more) are never taken
    spec = Speculator(drafter, SpecMode.AUTO, 4, 2, StepCosts(ShapeCosts({1: CostTable((1, 64), (0.010, 0.640))})))
    engine, _ = fake_engine(2, 1024, 64, speculator=spec, runtime=rt)
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
    def n_runs(max_tokens: int) -> int:
        rt = FakeRuntime()
        # verification nearly free, drafting 1 ms a token: pays in steady state; the 200-token
        # backlog costs ~0.2 s, which 5 tokens for the price of ~1.5 win back after ~30 tokens
        costs = StepCosts(ShapeCosts({1: CostTable((1, 5, 64), (0.010, 0.0105, 0.2))}),
                          ShapeCosts({1: CostTable((1, 64), (0.001, 0.064))}))
        spec = Speculator(RightDrafter(), SpecMode.AUTO, 4, 1, costs)
        engine, _ = fake_engine(1, 1024, 256, speculator=spec, runtime=rt)
        prompt = tuple(1 + i % (N_VOCAB - 1) for i in range(200))
        engine.submit(GenerationRequest("a", prompt, SamplingParams(temperature=0), max_tokens, ignore_eos=True),
                      lambda e: None)
        while engine.has_work:
            engine.step()
        return spec.n_runs

    assert n_runs(10) == 0
    assert n_runs(200) >= 30  # ~200 tokens at up to 5 a step


def test_auto_counts_the_step_time_its_costs_leave_out() -> None:
    """Each step also spends time outside the priced llama_decode calls (sampling, streaming);
    drafting pays it once for several tokens. With it learned, drafts that the decode costs alone
    call a small loss are taken."""
    def drafted_share(unpriced_s: float) -> tuple[float, UnpricedTime]:
        # its clock runs the priced time per token, plus unpriced_s per step
        rt = ClockedRuntime(lambda rows: 0.001 * sum(len(r.token_ids) for r in rows) + unpriced_s)
        # k tokens cost a bit more than k times one: even drafts that always land lose on these costs alone
        costs = StepCosts(ShapeCosts({1: CostTable((1, 64), (0.001, 0.066))}))
        spec = Speculator(NgramDrafter(), SpecMode.AUTO, 4, 1, costs)
        engine, _ = fake_engine(1, 256, 64, speculator=spec, runtime=rt, clock=rt.clock)
        # the fake model counts up: the prompt already holds every continuation, so n-gram drafts land
        engine.submit(GenerationRequest("a", tuple(list(range(1, 50)) + list(range(1, 5))),
                                        SamplingParams(temperature=0), 40, ignore_eos=True), lambda e: None)
        while engine.has_work:
            engine.step()
        return spec.n_accepted / 40, spec.unpriced

    share, unpriced = drafted_share(0.004)
    # learned for plain steps and for drafting ones alike (priced a little over 1 ms a token)
    assert unpriced.mean_s((1, 0)) == pytest.approx(0.004, rel=0.05)
    assert unpriced.mean_s((1, 4)) == pytest.approx(0.004, rel=0.05)
    assert share > 0.5  # most tokens came as accepted drafts
    share, unpriced = drafted_share(0.0)
    assert unpriced.mean_s((1, 0)) < 1e-9 and share < 0.1  # at most the exploration probes


def test_auto_learns_each_step_shapes_time_apart() -> None:
    """Calibration can under-price some shapes more than others (a longer KV, a slower machine):
    here steps with drafts take 12 ms a token where calibration says 5 tokens cost about one.
    Auto learns that from its drafting steps and leaves drafting (one mean for every shape grew
    with each drafting step and kept drafting looking cheap: 'paid once for several tokens')."""
    def dear_drafts_s(rows) -> float:  # a plain step takes its priced 10 ms, a step with drafts 12 ms a token
        n_tokens = sum(len(r.token_ids) for r in rows)
        return 0.010 if n_tokens == len(rows) else 0.012 * n_tokens

    rt = ClockedRuntime(dear_drafts_s)
    costs = StepCosts(ShapeCosts({1: CostTable((1, 5, 64), (0.010, 0.0105, 0.2))}))
    spec = Speculator(NgramDrafter(), SpecMode.AUTO, 4, 1, costs)
    engine, _ = fake_engine(1, 512, 64, speculator=spec, runtime=rt, clock=rt.clock)
    # the fake model counts up: the prompt holds every continuation, so n-gram drafts all land
    engine.submit(GenerationRequest("a", tuple(list(range(1, 150)) + list(range(1, 5))),
                                    SamplingParams(temperature=0), 120, ignore_eos=True), lambda e: None)
    while engine.has_work:
        engine.step()
    assert spec.n_accepted < 15  # a few drafting steps and probes out of 120 tokens
    assert spec.unpriced.mean_s((1, 4)) == pytest.approx(0.060 - 0.0105, rel=0.05)


def test_a_draft_model_starts_only_in_a_step_without_prompt_chunks() -> None:
    """A draft model's first read of a slot's backlog waits for a step that only decodes: beside a
    prompt chunk, its cost hid in the step's (and drafts looked nearly free there)."""
    drafter = RightDrafter()
    costs = StepCosts(ShapeCosts({1: CostTable((1, 5, 64), (0.010, 0.0105, 0.2))}),
                      ShapeCosts({1: CostTable((1, 64), (0.0001, 0.0064))}))  # drafting all but free: it pays
    spec = Speculator(drafter, SpecMode.AUTO, 4, 2, costs)
    engine, _ = fake_engine(2, 512, 64, speculator=spec)
    short = tuple(range(1, 11))
    long = tuple(1 + i % (N_VOCAB - 1) for i in range(250))  # four steps of prompt chunks
    for request_id, prompt in (("short", short), ("long", long)):
        engine.submit(GenerationRequest(request_id, prompt, SamplingParams(temperature=0), 60, ignore_eos=True),
                      lambda e: None)
    jobs_by_step = []  # (a prompt was in the step, draft jobs)
    while engine.has_work:
        prefilling = any(s.state is SlotState.PREFILL for s in engine.scheduler.pool.slots)
        before = drafter.n_jobs
        engine.step()
        jobs_by_step.append((prefilling, drafter.n_jobs - before))
    assert [jobs for prefilling, jobs in jobs_by_step if prefilling] == [0] * 4
    assert sum(jobs for _, jobs in jobs_by_step) >= 20  # then both slots drafted


class KindDrafter:
    """A free drafter that proposes the fake model's next tokens (it counts up) as kind 4 with the
    given prior, or, when alternating, those on even calls and wrong tokens on odd ones, as kind 2
    with the same prior."""

    name, is_free = "kinds", True

    def __init__(self, prior: float | None, alternate: bool = False) -> None:
        self.prior, self.alternate, self.n_calls = prior, alternate, 0

    def propose(self, jobs) -> None:
        self.n_calls += 1
        for job in jobs:
            right = not self.alternate or self.n_calls % 2 == 0
            job.draft_ids = [(job.context_ids[-1] + 1 + i) % N_VOCAB if right else 49 for i in range(job.k)]
            job.kind, job.prior = (4 if right else 2), self.prior

    def catch_up_len(self, slot_id, context_ids) -> int:
        return 0

    def close(self) -> None:
        pass


# one draft pays only where it is accepted more than ~3 times in 4: 1 + p tokens for 1.75 steps' time
STEEP = CostTable((1, 2, 5, 64), (0.010, 0.0175, 0.040, 0.640))


def first_drafting_step(prior: float | None) -> int | None:
    spec = Speculator(KindDrafter(prior), SpecMode.AUTO, 4, 1, StepCosts(ShapeCosts({1: STEEP})))
    engine, _ = fake_engine(1, 1024, 64, speculator=spec, runtime=FakeRuntime())
    engine.submit(GenerationRequest("a", (1, 2, 3), SamplingParams(temperature=0), 8, ignore_eos=True),
                  lambda e: None)
    step = 0
    while engine.has_work:
        engine.step()
        if spec.slots[0].k and spec.slots[0].kind == 4:
            return step
        step += 1
    return None


def test_the_drafters_prior_for_a_kind_decides_the_first_drafts() -> None:
    """Before any draft of a request was verified, a proposal the drafter rates at 0.9 (an n-gram
    matched on 4 tokens) is worth drafting on a costly target, and one at the default 0.6 is not:
    with that default, auto once never started on grounded work at one client."""
    assert first_drafting_step(0.9) == 1  # the first decode step (step 0 is the prompt's)
    assert first_drafting_step(None) is None


def test_auto_learns_acceptance_per_kind_of_proposal() -> None:
    """Both kinds start at the drafter's 0.9; right proposals (kind 4) keep being drafted while
    wrong ones (kind 2) are priced out once measured: one shared record would have averaged them
    to ~0.5 and drafted neither."""
    spec = Speculator(KindDrafter(0.9, alternate=True), SpecMode.AUTO, 4, 1, StepCosts(ShapeCosts({1: STEEP})))
    engine, _ = fake_engine(1, 1024, 64, speculator=spec, runtime=FakeRuntime())
    engine.submit(GenerationRequest("a", (1, 2, 3), SamplingParams(temperature=0), 200, ignore_eos=True),
                  lambda e: None)
    while engine.has_work:
        engine.step()
    right, wrong = spec.records[4], spec.records[2]
    assert right.overall == 1.0 and sum(right.proposed) >= 40
    assert wrong.overall == 0.0 and 1 <= sum(wrong.proposed) <= 8  # tried, then no more than probes
    assert spec.n_proposed == sum(right.proposed) + sum(wrong.proposed)


def test_ngram_proposals_say_how_many_tokens_matched() -> None:
    """The continuation of the longest matching suffix, labelled with its length and that length's
    prior; a lone matching token proposes nothing."""
    from runner.sampling.params import SamplingParams as Params
    from runner.speculation.drafter import DraftJob
    from runner.speculation.ngram_drafter import PRIOR_BY_MATCH

    def propose(context: list[int]) -> DraftJob:
        job = DraftJob(0, context, 3, Params(temperature=0))
        NgramDrafter().propose([job])
        return job

    long = propose([5, 6, 7, 8, 9, 1, 2, 5, 6, 7, 8])  # 5 6 7 8 was followed by 9 1 2
    assert (long.draft_ids, long.kind, long.prior) == ([9, 1, 2], 4, PRIOR_BY_MATCH[4])
    short = propose([3, 7, 8, 4, 5, 1, 7, 8])  # only "7 8" matches: 4 5 1 came after it
    assert (short.draft_ids, short.kind, short.prior) == ([4, 5, 1], 2, PRIOR_BY_MATCH[2])
    lone = propose([3, 7, 4, 5, 1, 7])  # one token: no proposal
    assert (lone.draft_ids, lone.kind) == ([], None)
