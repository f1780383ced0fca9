"""Per step, per slot: how many tokens to draft, the drafts themselves, and what was learned.

Modes: `on` drafts up to k_max for every generating slot; `auto` picks k per slot to maximize
expected generated tokens per second of step time, from the measured step costs (StepCosts)
and each request's acceptance estimate by draft position; `off` never drafts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from runner.runtime.micro_batches import Row
from runner.scheduler.batch import BatchPlan, BatchRow
from runner.scheduler.sequence import Sequence
from runner.scheduler.slots import SlotState
from runner.scheduler.snapshot import DraftCounts, SlotDrafts
from runner.speculation.auto_policy import (
    AutoDecision,
    Backoff,
    Ks,
    ProbeBudget,
    Shape,
    UnpricedTime,
    best_uniform_k,
    cheapest_probe,
    expected_tokens,
    probe_affordable,
)
from runner.speculation.cost_model import StepCosts
from runner.speculation.drafter import Drafter, DraftJob, n_common

PRIOR_WEIGHT = 4.0  # pseudo-observations behind the prior acceptance
PRIOR_ACCEPT = 0.6  # a drafter's acceptance before it has been measured (draft models: draft_agreement)
PRIOR_FROM_SERVER_AFTER = 8  # proposals of a kind, across requests, after which their record is the prior
STEADY_CATCH_UP = 2  # tokens a draft model's KV lacks at a step when it drafted at the last one
SLEEP_AFTER = 16  # auto's steps in a row without drafts before a drafter that taps the target (MTP, EAGLE3) sleeps


class SpecMode(str, Enum):
    OFF = "off"
    ON = "on"
    AUTO = "auto"


@dataclass
class Acceptance:
    """Accepted/proposed counts by draft position (1-based) for one request, or a drafter overall."""

    proposed: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)

    def record(self, n_proposed: int, n_accepted: int) -> None:
        while len(self.proposed) < n_proposed:
            self.proposed.append(0)
            self.accepted.append(0)
        for i in range(n_proposed):
            self.proposed[i] += 1
            self.accepted[i] += 1 if i < n_accepted else 0

    def rate(self, position: int, prior: float) -> float:
        """P(draft at `position` accepted | all before it accepted), smoothed toward the prior."""
        i = position - 1
        seen = self.proposed[i] if i < len(self.proposed) else 0
        ok = self.accepted[i] if i < len(self.accepted) else 0
        return (ok + prior * PRIOR_WEIGHT) / (seen + PRIOR_WEIGHT)

    @property
    def overall(self) -> float:
        total = sum(self.proposed)
        return sum(self.accepted) / total if total else 0.0


Kind = int | None  # DraftJob.kind: a kind of proposal with its own acceptance (None: the drafter's only kind)


@dataclass
class Shadow:
    """A free drafter's proposal that auto did not draft: scored, once the target has generated
    as many tokens after it, as verification would have scored it (greedy: exactly; sampled: a
    drafted token is accepted with the probability that the target samples it)."""

    seq: Sequence  # the request, whose output_ids it is scored against
    kind: Kind
    draft_ids: list[int]
    mark: int  # len(seq.output_ids) when proposed: the drafts stand for output_ids[mark:]

    def score(self) -> tuple[int, int] | None:
        """(positions proposed, accepted) once decided; None while the target has not reached them."""
        out = self.seq.output_ids[self.mark : self.mark + len(self.draft_ids)]
        if len(out) < len(self.draft_ids) and not self.seq.is_finished:
            return None
        return len(out), n_common(self.draft_ids, self.seq.output_ids, len(out), self.mark)


def _n_proposed(records: dict[Kind, Acceptance]) -> int:
    return sum(sum(r.proposed) for r in records.values())


def _n_accepted(records: dict[Kind, Acceptance]) -> int:
    return sum(sum(r.accepted) for r in records.values())


@dataclass
class SlotSpec:
    request_id: str | None = None
    records: dict[Kind, Acceptance] = field(default_factory=dict)  # the request's acceptance, per kind
    # ... and what auto estimates it from: those drafts plus the proposals it scored without drafting
    estimates: dict[Kind, Acceptance] = field(default_factory=dict)
    k: int = 0  # drafts chosen for the current step
    kind: Kind = None  # ... and their kind
    shadow: Shadow | None = None  # a proposal not drafted, waiting for the target's tokens

    @property
    def n_proposed(self) -> int:
        return _n_proposed(self.records)

    @property
    def n_accepted(self) -> int:
        return _n_accepted(self.records)


class Speculator:
    def __init__(self, drafter: Drafter, mode: SpecMode, k_max: int, n_slots: int, costs: StepCosts | None,
                 prior_accept: float = PRIOR_ACCEPT) -> None:
        self.drafter = drafter
        self.mode = mode
        self.k_max = k_max
        self.costs = costs
        self.prior_accept = prior_accept  # until the drafter has a record of its own on this server
        self.records: dict[Kind, Acceptance] = {}  # the drafter's record across requests, per kind: new ones' prior
        self.estimates: dict[Kind, Acceptance] = {}  # ... with the proposals scored without drafting (Shadow)
        self.slots = [SlotSpec() for _ in range(n_slots)]
        self.n_runs = 0  # verified draft runs (rows that carried drafts)
        self.probe_budget = ProbeBudget()
        self.unpriced = UnpricedTime()
        self.backoff = Backoff()
        self._priced_s: float | None = None  # the current step's priced time (None: not a steady decode-only step)
        self._shape: Shape = (0, 0)  # ... and its shape (UnpricedTime's key)
        self._generating: list = []  # this step's generating (slot id, Sequence)s
        self._steps_without_drafts = 0
        # a drafter that taps the target's rows (MTP, EAGLE3), which auto puts to sleep where it does not pay
        self._sleeper = drafter if mode is SpecMode.AUTO and costs is not None and hasattr(drafter, "sleep") else None
        if self._sleeper is not None and not self._worth_waking():
            self._sleeper.sleep()  # (its measured agreement says drafting cannot pay: its taps would cost for nothing)

    @property
    def n_proposed(self) -> int:
        return _n_proposed(self.records)

    @property
    def n_accepted(self) -> int:
        return _n_accepted(self.records)

    def counts(self) -> DraftCounts:
        slots = tuple(SlotDrafts(s.k, s.n_proposed, s.n_accepted) for s in self.slots)
        name_of = getattr(self.drafter, "kind_name", None)
        by_kind = tuple((name_of(kind) if name_of is not None and kind is not None else self.drafter.name,
                         sum(r.proposed), sum(r.accepted)) for kind, r in sorted(
                             self.records.items(), key=lambda item: -1 if item[0] is None else item[0]))
        gauges = getattr(self.drafter, "gauges", None)
        return DraftCounts(self.drafter.name, self.n_proposed, self.n_accepted, slots, by_kind,
                           tuple((gauges() if gauges is not None else {}).items()))

    def draft(self, plan: BatchPlan, n_batch: int, n_ctx_per_slot: int) -> None:
        """Add drafts to the plan's generating rows (the step's batch stays within n_batch)."""
        self._priced_s = None
        if self.mode is SpecMode.OFF:
            return
        if self._sleeper is not None and self._sleeper.is_asleep:
            if not (any(r.is_prompt for r in plan.rows) and self._worth_waking()):
                for spec in self.slots:  # nothing to decide: asleep, it drafts for no slot
                    spec.k = 0
                return
            self._steps_without_drafts = 0
            self._sleeper.wake()  # (from this step's decode on: a request starting now can draft)
        generating = [r for r in plan.rows if r.slot.state is SlotState.GENERATING and r.slot.seq is not None]
        self._generating = [(r.slot.id, r.slot.seq) for r in generating]  # (learn() shows them to the drafter)
        # a drafting model reads tokens: it cannot follow a prompt with images in it
        rows = [r for r in generating if r.slot.seq.request.speculate
                and (self.drafter.is_free or not r.slot.seq.request.media)]
        room = n_batch - plan.n_tokens
        caps = {}
        for row in rows:
            seq = row.slot.seq
            assert seq is not None
            spec = self._spec_for(row)
            # a draft never pushes past max_tokens or the slot's context
            cap = min(self.k_max, seq.n_tokens_left - 1, n_ctx_per_slot - row.slot.n_cached - 2)
            caps[row.slot.id] = max(0, cap)
            spec.k = 0
        if not rows or room <= 0:
            return
        if self.mode is SpecMode.AUTO and self.costs is not None and self.backoff.take_rest(self._rows_key(plan)):
            self.probe_budget.earn(self.probe_budget.last_plain_s)
            self._count_idle(0)
            return
        if self.drafter.is_free:  # propose everything, then keep what pays
            jobs = self._jobs(rows, caps)
            self.drafter.propose(jobs)
            for job in jobs:  # a proposal never reaches into an image's positions
                _cut_at_media(job)
            found = {j.slot_id: len(j.draft_ids) for j in jobs}
            for job in jobs:
                self.slots[job.slot_id].kind = job.kind
            ks = self._choose(plan, rows, found, room, {j.slot_id: j.prior for j in jobs})
            for row, job in zip(rows, jobs):
                k = ks[row.slot.id]
                row.add_drafts(job.draft_ids[:k])
                if self.mode is SpecMode.AUTO and not k and job.draft_ids:
                    self._keep_shadow(row, job)
        else:  # drafting costs: decide first, then draft only that much
            ks = self._choose(plan, rows, caps, room)
            self._count_idle(sum(ks.values()))
            jobs = self._jobs(rows, ks)
            self.drafter.propose([j for j in jobs if j.k > 0])
            for row, job in zip(rows, jobs):
                row.add_drafts(job.draft_ids[: job.k])
        for row in rows:
            self._cut_to_grammar(row)
            self.slots[row.slot.id].k = len(row.draft_ids)

    def _count_idle(self, n_drafts: int) -> None:
        """Auto put a drafter that taps the target's rows to sleep after SLEEP_AFTER steps without
        drafts: the taps cost every step even when nothing is drafted."""
        if self._sleeper is None:
            return
        self._steps_without_drafts = 0 if n_drafts else self._steps_without_drafts + 1
        if self._steps_without_drafts >= SLEEP_AFTER:
            self._sleeper.sleep()

    def _worth_waking(self) -> bool:
        """Would one slot drafting one token pay at the acceptance this drafter has shown so far?"""
        costs = self.costs
        assert costs is not None
        accept = self._prior(None, None)
        plain_s = costs.step_s([Row(0, 1, 1)], {0: 0})
        drafting_s = costs.step_s([Row(0, 2, 2)], {0: 1}, {0: STEADY_CATCH_UP})
        return (1 + accept) * plain_s > drafting_s

    def learn(self, plan: BatchPlan, step_s: float) -> None:
        """After verification: record acceptance by position for the request and the drafter, and
        how much longer than priced the step took (step_s: its wall time)."""
        after_step = getattr(self.drafter, "after_step", None)
        if after_step is not None:  # a drafter that reads every decode's target rows (MTP, EAGLE3)
            after_step(plan)
        if self._priced_s is not None:
            self.unpriced.observe(self._shape, step_s, self._priced_s)
            self._priced_s = None
        for row in plan.rows:
            spec = self.slots[row.slot.id]
            if row.draft_ids and not row.is_forced:
                for records in (spec.records, self.records, spec.estimates, self.estimates):
                    records.setdefault(spec.kind, Acceptance()).record(len(row.draft_ids), row.n_accepted)
                self.n_runs += 1
        self._score_shadows()
        observe = getattr(self.drafter, "observe", None)
        if observe is not None:  # a drafter that learns from what every slot generated (ngram_store)
            for slot_id, seq in self._generating:
                observe(slot_id, seq.request_id, seq.prompt_ids, seq.output_ids)
        self._generating = []

    def _keep_shadow(self, row: BatchRow, job: DraftJob) -> None:
        """A free proposal auto did not draft: scored later against what the target generates, so
        auto learns a kind's acceptance without paying for its verification (probes alone were too
        rare to learn it where one draft costs most of a step: F16 weights on one row here)."""
        spec, seq = self.slots[row.slot.id], row.slot.seq
        if spec.shadow is None and seq is not None:
            spec.shadow = Shadow(seq, job.kind, list(job.draft_ids), len(seq.output_ids))

    def _score_shadows(self) -> None:
        for spec in self.slots:
            shadow = spec.shadow
            if shadow is None or (scored := shadow.score()) is None:
                continue
            spec.shadow = None
            n_proposed, n_accepted = scored
            if n_proposed:  # (the spec is still the shadow's request's: a new request replaces both)
                for estimates in (spec.estimates, self.estimates):
                    estimates.setdefault(shadow.kind, Acceptance()).record(n_proposed, n_accepted)

    @staticmethod
    def _cut_to_grammar(row: BatchRow) -> None:
        """Drafts a constrained request's grammar would not take are cut before they enter the batch
        (verification would reject them anyway: the masked target gives them probability 0)."""
        constraint = row.slot.seq.request.constraint if row.slot.seq is not None else None
        if constraint is not None and row.draft_ids:
            n_valid = constraint.n_valid(row.draft_ids)
            if n_valid < len(row.draft_ids):
                row.add_drafts(row.draft_ids[:n_valid])

    def on_copy(self, src_slot: int, dst_slot: int) -> None:
        hook = getattr(self.drafter, "on_copy", None)
        if hook is not None:
            hook(src_slot, dst_slot)

    # -- internals ------------------------------------------------------------------------
    def _spec_for(self, row: BatchRow) -> SlotSpec:
        spec = self.slots[row.slot.id]
        request_id = row.slot.seq.request_id if row.slot.seq else None
        if spec.request_id != request_id:
            self.slots[row.slot.id] = spec = SlotSpec(request_id)
        return spec

    @staticmethod
    def _rows_key(plan: BatchPlan) -> tuple:
        return tuple((r.slot.id, r.slot.seq.request_id if r.slot.seq else None) for r in plan.rows)

    def _jobs(self, rows: list[BatchRow], ks: Ks) -> list[DraftJob]:
        jobs = []
        for row in rows:
            seq = row.slot.seq
            assert seq is not None and row.slot.next_token is not None
            context = row.slot.cached_ids + [row.slot.next_token]
            # (the target's sampling, its seed drawn if the request gave none: a draft model draws with it)
            jobs.append(DraftJob(row.slot.id, context, ks[row.slot.id], seq.sampler.params, seq.request_id))
        return jobs

    def _choose(self, plan: BatchPlan, rows: list[BatchRow], caps: Ks, room: int,
                priors: dict[int, float | None] | None = None) -> Ks:
        if self.mode is SpecMode.ON or self.costs is None:
            ks, left = {}, room
            for r in rows:
                ks[r.slot.id] = min(caps[r.slot.id], left)
                left -= ks[r.slot.id]
            return ks
        decision = self._decide_auto(plan, rows, caps, room, priors or {})
        self._apply(decision, plan)
        return decision.ks

    def _apply(self, decision: AutoDecision, plan: BatchPlan) -> None:
        """Auto's state learns from its decision: the probe budget, the step to compare, a rest."""
        if decision.plain_s is not None:
            self.probe_budget.earn(decision.plain_s, decision.probe_extra_s)
            if decision.is_probe:
                self.probe_budget.pay(decision.probe_extra_s)
        self._priced_s, self._shape = decision.priced_s, decision.shape
        if decision.is_lost:
            self.backoff.start(self._rows_key(plan))

    def _prior(self, kind: Kind, drafters_prior: float | None) -> float:
        """A kind's acceptance before the request has its own record: the server's record of that
        kind once it has one, else the drafter's estimate, else the speculator's prior."""
        record = self.estimates.get(kind)
        if record is not None and sum(record.proposed) >= PRIOR_FROM_SERVER_AFTER:
            return record.overall
        return drafters_prior if drafters_prior is not None else self.prior_accept

    def _gains(self, rows: list[BatchRow], caps: Ks, priors: dict[int, float | None]) -> dict[int, list[float]]:
        """Per slot, the marginal expected tokens of each further draft position (a decreasing product)."""
        gains: dict[int, list[float]] = {}
        for r in rows:
            spec = self.slots[r.slot.id]
            prior = self._prior(spec.kind, priors.get(r.slot.id))
            acc, p, g = spec.estimates.get(spec.kind) or Acceptance(), 1.0, []
            for pos in range(1, caps[r.slot.id] + 1):
                p *= acc.rate(pos, prior)
                g.append(p)
            gains[r.slot.id] = g
        return gains

    def _decide_auto(self, plan: BatchPlan, rows: list[BatchRow], caps: Ks, room: int,
                     priors: dict[int, float | None]) -> AutoDecision:
        """The ks with the most expected tokens per second of step time (best_uniform_k), a probe
        when none pays and the budget allows, or none where a draft model's backlog would not pay
        back. Reads the speculator's state; writes none of it (_apply does)."""
        costs = self.costs
        assert costs is not None
        gains = self._gains(rows, caps, priors)
        order = list(gains)
        drafting = {id(r) for r in rows}
        # steps are priced as decode steps of the generating rows alone: a prompt chunk in the step is
        # work done either way, and beside it drafts looked nearly free (a deep F16 target at 8 slots
        # drafted through its prefills at ~25 ms a token where its plain decode steps took 14)
        other_rows = [Row(r.slot.id, len(r.token_ids), r.n_logits) for r in plan.rows
                      if id(r) not in drafting and r.slot.state is SlotState.GENERATING]
        n_rows = len(order) + len(other_rows)
        is_decode_only = n_rows == len(plan.rows)
        catch_up = backlog = None
        if not self.drafter.is_free:
            # a draft model first reads what its KV lacks: one or two tokens while it keeps drafting,
            # a whole prompt (or all it skipped) the first time. Steps are compared in steady state
            # (charging the backlog to one step would keep auto from ever starting); the backlog is
            # then weighed against what drafting saves over the rest of the requests (_backlog_pays).
            backlog = {r.slot.id: self.drafter.catch_up_len(r.slot.id, r.slot.cached_ids + [r.slot.next_token])
                       for r in rows}
            catch_up = {sid: min(STEADY_CATCH_UP, n) for sid, n in backlog.items()}
            if not is_decode_only:  # ... and starts a slot (reads its backlog) only in a decode-only step:
                # beside prompt chunks the step's other costs hide it, and slots that finish their
                # prompts one by one would each start on a few steps' worth of steady-state saving
                gains = {sid: g if backlog[sid] <= catch_up[sid] else [] for sid, g in gains.items()}

        def priced_s_of(ks: Ks) -> float:  # the steady step's llama_decode calls, as calibrated
            return costs.step_s(other_rows + [Row(sid, 1 + ks[sid], 1 + ks[sid]) for sid in order], ks, catch_up)

        def step_s(ks: Ks) -> float:
            return self.unpriced.mean_s((n_rows, max(ks.values()))) + priced_s_of(ks)

        best = best_uniform_k(gains, step_s, room, self.k_max)
        if backlog is not None and any(best.values()) and not self._backlog_pays(
                rows, best, expected_tokens(gains, best), backlog, catch_up):
            best = {sid: 0 for sid in order}
        plain_s = probe_extra_s = None
        is_probe = False
        if self.drafter.is_free and not any(best.values()):
            # keep learning while drafting looks unprofitable: the slots with drafts probe, paid
            # from the probe budget (and only where a draft is cheap enough: probe_affordable)
            plain_s = step_s(best)
            probe, probe_extra_s = cheapest_probe(gains, step_s, plain_s, room)
            if (probe_affordable(probe, probe_extra_s, plain_s, n_rows)
                    and self.probe_budget.credit_after(plain_s, probe_extra_s) >= probe_extra_s):
                best, is_probe = probe, True
        priced_s, is_lost, shape = None, False, (n_rows, max(best.values()))
        if is_decode_only:  # learn what it takes beyond the priced time
            is_lost = any(gains.values()) and not any(best.values())  # drafts on offer, priced out (and no probe)
            # only steady steps: a draft model's first read of a backlog is priced apart (_backlog_pays),
            # and one such step must not set what every later step of its shape is priced at
            if backlog is None or all(backlog[sid] <= catch_up[sid] for sid in order if best[sid]):
                priced_s = priced_s_of(best)
        return AutoDecision(best, plain_s, probe_extra_s or 0.0, is_probe, priced_s, is_lost, shape)

    def _backlog_pays(self, rows: list[BatchRow], ks: Ks, expected: float, backlog: Ks, steady: Ks) -> bool:
        """Does drafting at these ks save more over the requests' remaining tokens than the draft
        model's one-off read of its backlog costs? Rates are taken for steady decode steps (one
        token and its drafts per slot): a step that also carries a long prefill makes drafts look
        nearly free, and starting there makes every drafting slot read its whole backlog at once."""
        costs = self.costs
        assert costs is not None
        if all(backlog[sid] <= steady[sid] for sid, k in ks.items() if k):
            return True
        ids = [r.slot.id for r in rows]
        zeros = {sid: 0 for sid in ids}
        plain_s = self.unpriced.mean_s((len(ids), 0)) + costs.step_s([Row(sid, 1, 1) for sid in ids], zeros)
        drafted = [Row(sid, 1 + ks[sid], 1 + ks[sid]) for sid in ids]
        drafting_s = costs.step_s(drafted, ks, steady)
        drafting_s += self.unpriced.cautious_s((len(ids), max(ks.values())), drafting_s)
        plain_s_per_token, drafting_s_per_token = plain_s / len(ids), drafting_s / expected
        once_s = costs.step_s(drafted, ks, backlog) - costs.step_s(drafted, ks, steady)
        remaining = sum(r.slot.seq.n_tokens_left for r in rows if r.slot.seq is not None)
        return remaining * (plain_s_per_token - drafting_s_per_token) > once_s


def _cut_at_media(job: DraftJob) -> None:
    """Drafts end before the first image placeholder a context lookup may have copied (ids < 0)."""
    cut = next((i for i, t in enumerate(job.draft_ids) if t < 0), None)
    if cut is not None:
        job.draft_ids = job.draft_ids[:cut]
