"""One step's batch plan: a row of tokens per slot (prompt chunk, or next token plus drafts)."""

from __future__ import annotations

from dataclasses import dataclass, field

from runner.sampling import Distribution
from runner.scheduler.slots import Slot


@dataclass
class BatchRow:
    """A run of one slot's tokens in the step's batch; the last n_logits of them output logits.

    A generating slot's row is its next token plus any drafts to verify (n_logits = 1 + drafts)."""

    slot: Slot
    token_ids: list[int]
    first_pos: int
    n_logits: int
    draft_ids: list[int] = field(default_factory=list)
    draft_dists: list[Distribution | None] = field(default_factory=list)
    n_accepted: int = 0  # set by postprocess
    is_forced: bool = False  # the drafts are the grammar's only continuation (jump-forward), not a drafter's
    n_prompt_logits: int = 0  # the first logits rows score prompt tokens (a request that asked for prompt logprobs)

    @property
    def seq_id(self) -> int:  # the runtime's sequence id is the slot's
        return self.slot.id

    def add_drafts(self, draft_ids: list[int], draft_dists: list[Distribution | None], is_forced: bool = False) -> None:
        self.draft_ids, self.draft_dists, self.is_forced = draft_ids, draft_dists, is_forced
        self.token_ids = self.token_ids[:1] + draft_ids
        self.n_logits = 1 + len(draft_ids)


@dataclass
class BatchPlan:
    rows: list[BatchRow] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.rows)

    @property
    def is_empty(self) -> bool:
        return not self.rows
