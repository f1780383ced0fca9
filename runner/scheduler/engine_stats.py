"""The engine's counters, and the one place a step's work is counted (`EngineStats.record`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from runner.scheduler.batch import BatchPlan, MediaRow
from runner.scheduler.request import FinishReason
from runner.scheduler.step_times import StepTimes


@dataclass
class EngineStats:
    n_requests: int = 0
    n_prompt_tokens: int = 0  # prompt tokens computed (not reused)
    n_cached_prompt_tokens: int = 0
    n_generated_tokens: int = 0  # sampled by the target, accepted drafts included
    n_steps: int = 0
    decode_s: float = 0.0
    n_forced_tokens: int = 0  # put in rows by jump-forward (constrained requests)
    n_media: int = 0  # image spans decoded into a KV (each its own decode)
    step_times: StepTimes = field(default_factory=StepTimes)  # the scheduler's: it plans prefills by them
    n_finished: dict[FinishReason, int] = field(default_factory=lambda: dict.fromkeys(FinishReason, 0))

    def count_finish(self, reason: FinishReason) -> None:
        """A generation ended (Sequence.finish, where every one ends)."""
        self.n_finished[reason] += 1

    def record_media(self, row: MediaRow) -> None:
        """An image span went into its slot's KV (its positions count as computed prompt)."""
        self.n_media += 1
        self.n_prompt_tokens += row.span.n_tokens
        if row.first_pos == row.slot.n_prompt_reused:  # the request's first computed part
            self.n_cached_prompt_tokens += row.slot.n_prompt_reused

    def record(self, plan: BatchPlan, decode_s: float) -> None:
        """Count a step whose rows were decoded (in decode_s) and sampled: one pass over its rows."""
        self.n_steps += 1
        self.decode_s += decode_s
        self.step_times.observe(plan.n_tokens, decode_s)
        for row in plan.rows:
            if row.n_logits > row.n_prompt_logits:  # the target sampled a token (and perhaps accepted drafts)
                self.n_generated_tokens += max(1, row.n_decided)  # (a beam's row: one, decided by its group)
            if row.is_forced:
                self.n_forced_tokens += len(row.draft_ids)
            if row.is_prompt:
                self.n_prompt_tokens += len(row.token_ids)
                # the request's first chunk: the prompt before it came from a cache (the slot keeps that
                # count after its request ends, as it may have in this step)
                if row.first_pos == row.slot.n_prompt_reused:
                    self.n_cached_prompt_tokens += row.slot.n_prompt_reused
