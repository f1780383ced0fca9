"""One step's batch plan: a row of tokens per slot (prompt chunk, or next token plus drafts)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from runner.scheduler.request import MediaSpan
from runner.scheduler.slots import Slot


class RowKind(str, Enum):
    """What a row is, decided when it is planned; the scheduler takes its logits by it."""

    PROMPT = "prompt"  # a chunk of a prompt that is not its last: its logits (if any) only score it
    PROMPT_END = "prompt_end"  # a prompt's last chunk: its last logits give the reply's first token
    PROMPT_ONLY = "prompt_only"  # ... of a request that generates nothing (max_tokens 0: prompt logprobs)
    NEXT_TOKEN = "next_token"  # a generating slot's next token, and any drafts to verify


@dataclass
class BatchRow:
    """A run of one slot's tokens in the step's batch; the last n_logits of them output logits.

    A generating slot's row is its next token plus any drafts to verify (n_logits = 1 + drafts)."""

    slot: Slot
    token_ids: list[int]
    first_pos: int
    n_logits: int
    draft_ids: list[int] = field(default_factory=list)
    n_accepted: int = 0  # set by postprocess: drafts the reply took
    n_decided: int = 0  # ... and tokens the target decided for it (those drafts, its own, an end-of-generation)
    is_forced: bool = False  # the drafts are the grammar's only continuation (jump-forward), not a drafter's
    n_prompt_logits: int = 0  # the first logits rows score prompt tokens (a request that asked for prompt logprobs)
    kind: RowKind = RowKind.NEXT_TOKEN

    @property
    def is_prompt(self) -> bool:  # its tokens are prompt tokens, computed (not taken from a cache)
        return self.kind is not RowKind.NEXT_TOKEN

    @property
    def seq_id(self) -> int:  # the runtime's sequence id is the slot's
        return self.slot.id

    def add_drafts(self, draft_ids: list[int], is_forced: bool = False) -> None:
        self.draft_ids, self.is_forced = draft_ids, is_forced
        self.token_ids = self.token_ids[:1] + draft_ids
        self.n_logits = 1 + len(draft_ids)


@dataclass(frozen=True)
class MediaRow:
    """An image span decoded into its slot's KV this step, before the token rows (its own decode)."""

    slot: Slot
    span: MediaSpan

    @property
    def seq_id(self) -> int:
        return self.slot.id

    @property
    def first_pos(self) -> int:
        return self.span.start


@dataclass
class BatchPlan:
    rows: list[BatchRow] = field(default_factory=list)
    media: MediaRow | None = None  # at most one image per step: its encode and decode stall the others
    # the rows whose request follows a grammar (jump-forward and mask prefetch look at these alone;
    # almost always none, and then neither costs a pass over the rows)
    constrained: list[BatchRow] = field(default_factory=list)

    def add(self, row: BatchRow) -> None:
        self.rows.append(row)
        if row.slot.seq is not None and row.slot.seq.request.constraint is not None:
            self.constrained.append(row)

    @property
    def n_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.rows)

    @property
    def is_empty(self) -> bool:
        return not self.rows and self.media is None
