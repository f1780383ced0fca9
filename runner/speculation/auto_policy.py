"""`--spec auto`'s pieces: a pure choice of k, and one small object per piece of state it keeps.

The speculator computes a decision from these (reading, never writing) and then applies it:
the probe budget earns or pays, the unpriced-time mean learns after the step, the back-off
starts a rest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

EXPLORE_SHARE = 0.01  # free drafters: at most this share of step time goes to probing when nothing drafts
PROBE_MAX_EXTRA = 0.5  # ... and only probes adding at most this share of a row's plain time per draft
DECIDE_EVERY = 4  # after drafts were priced and lost, the same rows decide again this many steps later
UNPRICED_WEIGHT = 0.1  # weight of the latest decode step in a shape's running mean of time the step costs leave out

Ks = dict[int, int]  # slot id -> drafts for this step


def expected_tokens(gains: dict[int, list[float]], ks: Ks) -> float:
    """Tokens a step yields: each slot's own, plus its drafts' chances of being accepted.

    gains[slot][i]: the probability that draft i+1 and all before it are accepted."""
    return sum(1.0 + sum(gains[sid][: ks[sid]]) for sid in gains)


def best_uniform_k(gains: dict[int, list[float]], price_s: Callable[[Ks], float], room: int, k_max: int) -> Ks:
    """The same k for every slot (capped by the drafts each slot has on offer, and by `room`
    tokens in the batch) with the most expected tokens per second of step time.

    NOTE: only uniform ks are tried. Unequal rows split the batch into more graph runs, which on
    a CPU costs more than fitting k per slot gains; a per-slot search also cost milliseconds per
    step at 8 slots. Costs only grow with k, so the search stops once even every draft accepted
    could not beat the best rate."""
    best = last = {sid: 0 for sid in gains}
    best_rate = expected_tokens(gains, best) / price_s(best)
    most_tokens = sum(1.0 + sum(g) for g in gains.values())
    for k in range(1, k_max + 1):
        trial = {sid: min(k, len(g)) for sid, g in gains.items()}
        if trial == last or sum(trial.values()) > room:
            break  # no slot has more drafts to offer, or no room for them
        last = trial
        trial_s = price_s(trial)
        if (rate := expected_tokens(gains, trial) / trial_s) > best_rate:
            best, best_rate = trial, rate
        elif most_tokens / trial_s <= best_rate:
            break
    return best


def cheapest_probe(gains: dict[int, list[float]], price_s: Callable[[Ks], float], plain_s: float,
                   room: int) -> tuple[Ks, float]:
    """The probe that adds the least step time per draft: every slot with drafts on offer drafts
    the same k (or all it has), k from 1 up; and the time it adds to the plain step.

    NOTE: not always one draft: where a second token costs the step much more than the first
    (F16 weights on this CPU, one row: 9.6 ms, 16.5 for two, 18.2 for four), one draft was too
    dear to probe with, so a drafter's acceptance was never measured and it never drafted, while
    four drafts cost little more and measure four positions at once."""
    best, best_extra_s, best_per_draft_s = {sid: 0 for sid in gains}, 0.0, float("inf")
    for k in range(1, max((len(g) for g in gains.values()), default=0) + 1):
        probe = {sid: min(k, len(g)) for sid, g in gains.items()}
        n_drafts = sum(probe.values())
        if n_drafts > room:
            break
        extra_s = price_s(probe) - plain_s
        if extra_s / n_drafts < 0.99 * best_per_draft_s:  # (deeper only where clearly cheaper per draft)
            best, best_extra_s, best_per_draft_s = probe, extra_s, extra_s / n_drafts
    return best, best_extra_s


def probe_affordable(probe: Ks, extra_s: float, plain_s: float, n_rows: int) -> bool:
    """At most PROBE_MAX_EXTRA of a row's share of the plain step (n_rows rows) per draft: probes
    that split the batch into extra graph runs (some rows drafting, some not) measured dearer
    than priced."""
    n_drafts = sum(probe.values())
    return n_drafts > 0 and extra_s / n_drafts <= PROBE_MAX_EXTRA * plain_s / n_rows


@dataclass
class ProbeBudget:
    """Step time that probes (drafts taken while drafting looks unprofitable) may spend:
    EXPLORE_SHARE of each plain step, saved up to one probe at most (no bursts after a stretch
    without drafts)."""

    credit_s: float = 0.0
    last_plain_s: float = 0.0  # the last priced plain step (a resting step earns as much)

    def credit_after(self, plain_s: float, probe_extra_s: float) -> float:
        return min(self.credit_s + EXPLORE_SHARE * plain_s, max(probe_extra_s, plain_s))

    def earn(self, plain_s: float, probe_extra_s: float = 0.0) -> None:
        self.credit_s = self.credit_after(plain_s, probe_extra_s)
        self.last_plain_s = plain_s

    def pay(self, extra_s: float) -> None:
        self.credit_s -= extra_s


Shape = tuple[int, int]  # a decode step's rows, and the most drafts any of them carries


@dataclass
class UnpricedTime:
    """Running means, by step shape, of how much longer than priced a steady decode step took:
    the engine's own Python (sampling, streaming, drafting bookkeeping), a KV longer than
    calibration's, and the machine's speed drifting since calibration. By shape because the
    shortfall grows with the step's tokens (a deep F16 target at 8 rows: 1 token each took 1.09x
    its calibrated time, 5 each 1.47x, and one mean for both made every draft look cheap).

    A shape not seen yet takes the shortfall of the nearest seen one with no more drafts (nearest
    rows first); none seen, none. Never a dearer shape's: its cheaper neighbours would look as
    dear and never be tried."""

    means: dict[Shape, float] = field(default_factory=dict)
    priced: dict[Shape, float] = field(default_factory=dict)  # the same steps' priced time
    counts: dict[Shape, int] = field(default_factory=dict)

    def _nearest(self, shape: Shape) -> Shape | None:
        rows, k = shape
        seen = [s for s in self.means if s[1] <= k]
        return min(seen, key=lambda s: (abs(s[0] - rows), k - s[1])) if seen else None

    def mean_s(self, shape: Shape) -> float:
        if shape in self.means:
            return self.means[shape]
        nearest = self._nearest(shape)
        return self.means[nearest] if nearest is not None else 0.0

    def cautious_s(self, shape: Shape, priced_s: float) -> float:
        """mean_s for a bet that cannot be taken back (a draft model's first read of a backlog): a
        shape not seen yet takes the nearest one's shortfall grown in proportion to its priced
        time where that is more. (At 4 rows, 2 drafts each took 229 ms priced at 166, while plain
        steps took 90 priced at 76: the plain steps' 14 ms as it stood made four slots' start
        look worth their backlogs, and they lost 6% of the run.)"""
        nearest = shape if shape in self.means else self._nearest(shape)
        if nearest is None:
            return 0.0
        mean, priced = self.means[nearest], self.priced[nearest]
        if nearest == shape or priced <= 0:
            return mean
        return max(mean, mean * priced_s / priced)

    def observe(self, shape: Shape, step_s: float, priced_s: float) -> None:
        # NOTE: never below zero: calibration keeps each shape's fastest time, and a faster step
        # (a fake runtime in tests) would otherwise make every step look free
        unpriced = max(0.0, step_s - priced_s)
        n = self.counts.get(shape, 0)
        weight = max(UNPRICED_WEIGHT, 1.0 / (n + 1))  # a plain mean of the first steps, then a running one
        mean, priced = self.means.get(shape, 0.0), self.priced.get(shape, 0.0)
        self.means[shape] = mean + weight * (unpriced - mean)
        self.priced[shape] = priced + weight * (priced_s - priced)
        self.counts[shape] = n + 1


@dataclass
class Backoff:
    """After drafts were priced and lost, the same rows skip the next DECIDE_EVERY - 1 decisions.

    Nothing a decision reads has changed meanwhile (no draft was verified, so no acceptance
    moved) but which slots happen to have n-gram matches, and deciding costs Python every step."""

    n_left: int = 0
    rows_key: tuple = ()

    def start(self, rows_key: tuple) -> None:
        self.n_left, self.rows_key = DECIDE_EVERY - 1, rows_key

    def take_rest(self, rows_key: tuple) -> bool:
        """Does this step rest? (other rows than the ones that lost end the rest)"""
        if self.n_left == 0:
            return False
        if rows_key != self.rows_key:
            self.n_left = 0
            return False
        self.n_left -= 1
        return True


@dataclass(frozen=True)
class AutoDecision:
    """What auto chose for one step, and what the speculator's state objects learn from it."""

    ks: Ks
    plain_s: float | None = None  # nothing paid and the drafter is free: the plain step the budget earns from
    probe_extra_s: float = 0.0  # what a probe would add to that step
    is_probe: bool = False  # the ks are a probe, paid from the budget
    priced_s: float | None = None  # a steady decode-only step's priced time (UnpricedTime compares after the step)
    is_lost: bool = False  # drafts were on offer and priced out (and no probe): rest
    shape: Shape = (0, 0)  # the step's rows and most drafts (UnpricedTime's key for priced_s)
