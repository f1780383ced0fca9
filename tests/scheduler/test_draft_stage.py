"""Draft stages compose: none is the null stage, one is itself, several run in order."""

from __future__ import annotations

from runner.scheduler.batch import BatchPlan
from runner.scheduler.draft_stage import NO_DRAFTS, compose


class Recording:
    def __init__(self, name: str, log: list[tuple[str, str]]) -> None:
        self.name, self.log = name, log

    def propose(self, plan: BatchPlan) -> None:
        self.log.append(("propose", self.name))

    def learn(self, plan: BatchPlan, step_s: float) -> None:
        self.log.append(("learn", self.name))


def test_no_stage_is_the_null_stage_and_one_stage_is_itself() -> None:
    assert compose([]) is NO_DRAFTS
    stage = Recording("a", [])
    assert compose([stage]) is stage


def test_stages_propose_and_learn_in_order() -> None:
    log: list[tuple[str, str]] = []
    stage = compose([Recording("speculation", log), Recording("jump-forward", log)])
    stage.propose(BatchPlan())
    stage.learn(BatchPlan(), 0.01)
    assert log == [("propose", "speculation"), ("propose", "jump-forward"),
                   ("learn", "speculation"), ("learn", "jump-forward")]
