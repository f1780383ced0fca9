"""The step's draft stage: it puts drafts into the plan's rows before the decode (`propose`) and
learns from their verdict after it (`learn`). Speculation (speculation_stage.py: a drafter's guesses)
and jump-forward (jump_forward.py: a grammar's forced tokens) are draft stages; a step with neither
has NO_DRAFTS, one with both has them in order (DraftStages). A new kind of draft is a new stage,
not new lines in the step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from runner.scheduler.batch import BatchPlan


class DraftStage(Protocol):
    def propose(self, plan: BatchPlan) -> None: ...  # add drafts to the plan's rows, within its budget
    def learn(self, plan: BatchPlan, step_s: float) -> None: ...  # after verification (step_s: the step's time)


class NoDrafts:
    """The null stage: every row decodes its one token."""

    def propose(self, plan: BatchPlan) -> None:
        pass

    def learn(self, plan: BatchPlan, step_s: float) -> None:
        pass


NO_DRAFTS = NoDrafts()


class DraftStages:
    """Stages in order: each proposes on the rows (and the budget) that those before it left."""

    def __init__(self, stages: Sequence[DraftStage]) -> None:
        self.stages = tuple(stages)

    def propose(self, plan: BatchPlan) -> None:
        for stage in self.stages:
            stage.propose(plan)

    def learn(self, plan: BatchPlan, step_s: float) -> None:
        for stage in self.stages:
            stage.learn(plan, step_s)


def compose(stages: Sequence[DraftStage]) -> DraftStage:
    """One stage for the step: none, the only one, or all of them in order."""
    if not stages:
        return NO_DRAFTS
    return stages[0] if len(stages) == 1 else DraftStages(stages)
