"""Prompt lookup: propose the tokens that followed the latest n-gram the last time it occurred.

No model: when the output copies the input (rewrite, edit, quote, code), the continuation of
the current suffix is usually already somewhere in the context. Where the context has no match
of 3 tokens or more, a store learned from every request's replies (ngram_store.py, when given
one) proposes instead, as a kind of its own; a 2-token match of the context comes last.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from runner.speculation.drafter import DraftJob, register_drafter
from runner.speculation.ngram_store import NgramStore

NGRAM_MAX = 4
NGRAM_MIN = 2  # a lone matching token predicts little: 0.31 acceptance on free chat, where drafts lose
# First-draft acceptance by match length, measured with SmolLM2 on bench/speculative.py's prompts
# (8 clients, forced on): 2 tokens 0.53 (chat) to 0.67 (grounded), 3 tokens ~0.5 (rare), 4 tokens
# 1.0 (grounded; rare in chat). The prior until auto has measured a kind: set well below, since auto
# measures one for free from the proposals it does not draft (speculator.Shadow), while a prior
# that drafts wrongly costs for real (at 0.9 for 4 tokens, one wrong 4-token draft at one client
# cost 3% of a 48-token free-chat reply on F16 weights; grounded work drafts as much at 0.5).
PRIOR_BY_MATCH = {2: 0.3, 3: 0.4, 4: 0.5}
STORE_KIND = 100  # DraftJob.kind of the store's proposals (the context's are their match length)
STORE_PRIOR = 0.3  # until this server has measured the store's own acceptance
# The store (keyed on 4 tokens, what this model wrote after them before) is asked before a context
# match shorter than this: at 4 clients on bench/speculative.py's repeating workload, first drafts
# were accepted at 0.95 from the store, 0.78 from 4-token context matches, 0.6 from 3, 0.19 from 2
# (and 2-token matches are frequent: they hid most of the store's proposals).
STORE_FIRST_BELOW = 3


@dataclass
class _Index:
    """For one slot: n-gram -> the position right after its latest occurrence."""

    n_indexed: int = 0  # tokens of the context already indexed
    after: dict[tuple[int, ...], int] = field(default_factory=dict)
    ids: list[int] = field(default_factory=list)


class NgramDrafter:
    name = "ngram"
    is_free = True

    def __init__(self, n_max: int = NGRAM_MAX, n_min: int = NGRAM_MIN, store: NgramStore | None = None,
                 **_: object) -> None:
        self.n_max, self.n_min = n_max, n_min
        self.store = store
        self._indexes: dict[int, _Index] = {}
        self._fed: dict[int, tuple[str, int]] = {}  # slot -> (request, output tokens the store has learned)

    def kind_name(self, kind: int | None) -> str:
        return "store" if kind == STORE_KIND else f"context-{kind}"

    def _index(self, slot_id: int, context: list[int]) -> _Index:
        index = self._indexes.get(slot_id)
        if index is None or context[: index.n_indexed] != index.ids[: index.n_indexed]:
            index = self._indexes[slot_id] = _Index()
        index.ids = context
        # index every n-gram that ends before the last token (the suffix we look up must not find itself)
        for end in range(max(index.n_indexed, self.n_min), len(context)):
            for n in range(self.n_min, self.n_max + 1):
                if end - n >= 0:
                    index.after[tuple(context[end - n : end])] = end
        index.n_indexed = max(index.n_indexed, len(context) - 1)
        return index

    def propose(self, jobs: list[DraftJob]) -> None:
        """Each job's drafts: the context's longest match of STORE_FIRST_BELOW tokens or more, else
        the store's chain, else a shorter match of the context."""
        for job in jobs:
            ctx = job.context_ids
            index = self._index(job.slot_id, ctx)
            longest = min(self.n_max, len(ctx))
            if not (self._from_context(job, index, range(longest, STORE_FIRST_BELOW - 1, -1))
                    or self._from_store(job)):
                self._from_context(job, index, range(min(longest, STORE_FIRST_BELOW - 1), self.n_min - 1, -1))

    def _from_context(self, job: DraftJob, index: _Index, lengths: range) -> bool:
        ctx = job.context_ids
        for n in lengths:
            start = index.after.get(tuple(ctx[-n:]))
            if start is not None and start < len(ctx):
                job.draft_ids = ctx[start : start + job.k]
                job.kind, job.prior = n, PRIOR_BY_MATCH.get(n)
                return True
        return False

    def _from_store(self, job: DraftJob) -> bool:
        if self.store is None:
            return False
        job.draft_ids = self.store.draft(job.context_ids, job.k)
        job.kind, job.prior = STORE_KIND, STORE_PRIOR
        return bool(job.draft_ids)

    def observe(self, slot_id: int, request_id: str, prompt_ids: tuple[int, ...], output_ids: list[int]) -> None:
        """A slot's committed tokens after a step: the output the store has not learned yet teaches it."""
        if self.store is None:
            return
        fed_request, n_fed = self._fed.get(slot_id, ("", 0))
        n_fed = n_fed if fed_request == request_id else 0
        if len(output_ids) <= n_fed:
            return
        n = self.store.n
        head = list(prompt_ids[max(0, len(prompt_ids) - (n - n_fed)):]) if n_fed < n else []  # what precedes it
        out_from = max(0, n_fed - n)
        ids = head + output_ids[out_from:]
        self.store.learn(ids, len(head) + n_fed - out_from)
        self._fed[slot_id] = (request_id, len(output_ids))

    def gauges(self) -> dict[str, float]:
        """What the store holds, for /metrics."""
        if self.store is None:
            return {}
        return {"ngram_store_bytes": self.store.n_bytes, "ngram_store_entries": self.store.n_filled}

    def catch_up_len(self, slot_id: int, context_ids: list[int]) -> int:
        return 0

    def close(self) -> None:
        self._indexes.clear()
        self._fed.clear()


register_drafter("ngram", lambda **kw: NgramDrafter(**kw))
