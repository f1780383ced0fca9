"""Jump-forward: where a request's grammar allows exactly one continuation (a schema's fixed keys,
punctuation), those tokens ride in its row as drafts. They are verified like any draft (the masked
target gives them probability 1), so several forced tokens cost one step."""

from __future__ import annotations

from runner.scheduler.batch import BatchPlan
from runner.scheduler.slots import SlotState


class JumpForward:
    """A draft stage (draft_stage.DraftStage) for the plan's constrained rows that have no drafts yet."""

    def __init__(self, n_batch: int, n_ctx_per_slot: int) -> None:
        self.n_batch = n_batch  # the step's token budget
        self.n_ctx_per_slot = n_ctx_per_slot

    def propose(self, plan: BatchPlan) -> None:
        if not plan.constrained:  # (almost always: then nothing here costs a pass over the rows)
            return
        room = self.n_batch - plan.n_tokens
        for row in plan.constrained:
            seq = row.slot.seq
            if room <= 0 or row.draft_ids or row.slot.state is not SlotState.GENERATING or seq is None:
                continue
            constraint = seq.request.constraint
            assert constraint is not None  # (plan.constrained holds only rows with one)
            # forced tokens never push past max_tokens or the slot's context
            cap = min(room, seq.n_tokens_left - 1, self.n_ctx_per_slot - row.slot.n_cached - 2)
            forced = constraint.forced_tokens()[: max(0, cap)]
            if forced:
                row.add_drafts(forced, is_forced=True)
                room -= len(forced)

    def learn(self, plan: BatchPlan, step_s: float) -> None:
        pass  # a grammar's forced tokens are always right: nothing to learn
