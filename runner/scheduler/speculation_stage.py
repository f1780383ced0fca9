"""Speculative decoding as the step's draft stage: the step loop reaches the speculator
(speculation.speculator.Speculator) only through the `Speculation` protocol, so it never imports it."""

from __future__ import annotations

from typing import Protocol

from runner.scheduler.batch import BatchPlan
from runner.scheduler.snapshot import DraftCounts


class Speculation(Protocol):
    """What the step loop asks of speculative decoding."""

    def draft(self, plan: BatchPlan, n_batch: int, n_ctx_per_slot: int) -> None: ...
    def learn(self, plan: BatchPlan, step_s: float) -> None: ...
    def on_copy(self, src_slot: int, dst_slot: int) -> None: ...
    def counts(self) -> DraftCounts: ...


class SpeculationStage:
    """A draft stage (draft_stage.DraftStage): drafts within the step's budget and each slot's context."""

    def __init__(self, speculation: Speculation, n_batch: int, n_ctx_per_slot: int) -> None:
        self.speculation = speculation
        self.n_batch = n_batch
        self.n_ctx_per_slot = n_ctx_per_slot

    def propose(self, plan: BatchPlan) -> None:
        self.speculation.draft(plan, self.n_batch, self.n_ctx_per_slot)

    def learn(self, plan: BatchPlan, step_s: float) -> None:
        self.speculation.learn(plan, step_s)
