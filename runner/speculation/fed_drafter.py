"""A drafter fed by the target's own rows: a small context (MTP layers, an EAGLE3 head) whose every
KV position takes a token together with a row the target computed for the token before it.

Position p of the draft KV holds context token i = p + shift with row(i - 1), the target's row of
the token before (MTP: shift 0, the hidden row; EAGLE3: shift 1, its fused layer inputs). Its logits
guess token i + 1; its own hidden row goes with that guess into the next position. Each step, one
batched decode catches every drafting slot up to its committed tokens (the rows come from
target_rows.TargetRows, kept after every step) and yields the first drafts; then one batched decode
per further draft position. The drafts' positions hold the drafter's rows, not the target's: they
are removed after the step, so the draft KV holds only tokens fed with the target's rows.
"""

from __future__ import annotations

import numpy as np

from runner.runtime.llama import Batch, Context, ContextShape
from runner.runtime.model_runner import ModelRunner
from runner.scheduler.batch import BatchPlan
from runner.speculation.draft_samplers import DraftSamplers
from runner.speculation.drafter import DraftJob, n_common
from runner.speculation.target_rows import TargetRows

CANNOT_CATCH_UP = 1 << 30  # a backlog no saving pays for: auto never drafts there
AGREEMENT_TOKENS_MIN = 16  # fewer positions than this say too little to replace the generic prior


class FedDrafter:
    name = "fed"
    is_free = False
    shift = 0  # draft position p holds context token p + shift
    # a graph without output selection (EAGLE3's): every row computes logits, and llama.cpp hands
    # back the first rows' as the outputs. A batch's rows all output logits or none do.
    all_logits = False

    def __init__(self, target: ModelRunner, context: Context, shape: ContextShape, row_width: int,
                 embd_width: int) -> None:
        self.target = target
        self.context = context
        self.context.capture_hidden(masked=False)  # (all rows, by batch index: catch-up and drafts share a batch)
        self._batch = Batch(max(shape.n_batch, shape.n_seq * 2), embd_width)
        self.rows = TargetRows(row_width, shape.n_ctx_per_seq)
        self._cached: dict[int, list[int]] = {}  # per slot: context tokens in the draft KV, fed with the target's rows
        self._samplers = DraftSamplers()
        self._chained: set[int] = set()  # slots whose draft KV holds draft positions until after_step
        self.is_asleep = False
        self.taps(True)

    def inputs(self, slot_id: int, i0: int, i1: int) -> np.ndarray:
        """The embedding rows that go with context tokens [i0, i1) (from the target's rows of i0-1..i1-2)."""
        raise NotImplementedError

    def inputs_of(self, spans: list[tuple[int, int, int]]) -> list[np.ndarray]:
        """inputs() for several (slot, i0, i1) at once (EAGLE3 encodes them all in one pass)."""
        return [self.inputs(*span) for span in spans]

    def after_step(self, plan: BatchPlan) -> None:
        """Keep the step's target rows (the speculator calls this after every step) and drop the
        drafts' positions from the draft KV."""
        if not self.is_asleep:
            self.rows.record(plan, self.target)
        for slot_id in self._chained:
            self.context.kv_remove(slot_id, len(self._cached[slot_id]), -1)
        self._chained.clear()

    def propose(self, jobs: list[DraftJob]) -> None:
        jobs = sorted((j for j in jobs if j.k > 0 and self._can_draft(j.slot_id, j.context_ids)),
                      key=lambda j: j.slot_id)
        if not jobs:
            return
        try:
            self._draft(jobs)
        except BaseException:  # (a failed decode: what these slots' draft KV holds is no longer known)
            for job in jobs:
                self.context.kv_remove(job.slot_id, 0, -1)
                self._cached.pop(job.slot_id, None)
            raise

    def _draft(self, jobs: list[DraftJob]) -> None:
        logits, hidden = self._catch_up(jobs)
        positions = {j.slot_id: len(j.context_ids) - self.shift for j in jobs}  # where each next draft goes
        live = list(range(len(jobs)))
        for _ in range(max(j.k for j in jobs)):
            for row, i in enumerate(live):
                jobs[i].draft_ids.append(self._samplers.draw(jobs[i], logits[row]))
            fed = [(i, hidden[row]) for row, i in enumerate(live) if len(jobs[i].draft_ids) < jobs[i].k]
            if not fed:
                break
            live = [i for i, _ in fed]
            self._batch.clear()
            for i, h in fed:  # this depth's drafts, each with the drafter's own row for the token before
                slot = jobs[i].slot_id
                self._batch.add(slot, [jobs[i].draft_ids[-1]], positions[slot], 1, embd=h[None, :])
                positions[slot] += 1
                self._chained.add(slot)
            logits = self.context.decode(self._batch)
            hidden = self.context.hidden(self._batch.n_tokens)

    def _can_draft(self, slot_id: int, context_ids: list[int]) -> bool:
        """Are the target's rows there for every token the draft KV lacks (none missed while asleep)?"""
        if self.is_asleep or len(context_ids) <= self.shift:
            return False
        first_row = max(0, self._n_common(slot_id, context_ids) + self.shift - 1)
        return self.rows.covers(slot_id, context_ids, first_row, len(context_ids) - 1)

    def _n_common(self, slot_id: int, context_ids: list[int]) -> int:
        """Leading positions the draft KV already holds (the last token is always fed again)."""
        return n_common(self._cached.get(slot_id, []), context_ids, len(context_ids) - 1 - self.shift, self.shift)

    def catch_up_len(self, slot_id: int, context_ids: list[int]) -> int:
        """Tokens to feed before drafting; CANNOT_CATCH_UP where a row it needs was not kept."""
        if not self._can_draft(slot_id, context_ids):
            return CANNOT_CATCH_UP
        return max(0, len(context_ids) - self.shift - self._n_common(slot_id, context_ids))

    def measure_agreement(self, token_ids: list[int]) -> float | None:
        """Share of the positions of a text (a fresh context's first sequence) where the drafter's
        most likely token is the target's: auto's first acceptance estimate, as for a draft model."""
        n = min(len(token_ids), self._batch.n_tokens_max, self.context.shape.n_ubatch, self.target.context.shape.n_ubatch,
                self.target.context.shape.n_ctx_per_seq)
        if n < AGREEMENT_TOKENS_MIN or self.is_asleep:
            return None
        token_ids, target = token_ids[:n], self.target.context
        batch = Batch(n)
        batch.add(0, token_ids, 0, n)
        try:
            wanted = target.decode(batch).argmax(axis=1)  # wanted[i]: the target's guess of token i+1
            rows = self.target.tap(target, n)
        finally:
            target.kv_remove(0)
        self.rows.put(0, 0, token_ids, rows)
        self._batch.clear()
        fed = token_ids[self.shift :]
        self._batch.add(0, fed, 0, len(fed), embd=self.inputs(0, self.shift, n))
        try:  # draft position p guesses token p + shift + 1
            guessed = self.context.decode(self._batch).argmax(axis=1)
        finally:
            self.context.kv_remove(0)
            self.rows.forget(0)
        return float(np.mean(guessed == wanted[self.shift :]))

    # -- asleep: no taps -------------------------------------------------------------------------
    def taps(self, on: bool) -> None:
        """Have the target keep (or stop keeping) the rows this drafter reads, from its next decode."""
        raise NotImplementedError

    def sleep(self) -> None:
        """Stop reading the target's rows (their output costs the target's every step, ~10% of a
        small model's): auto calls this when drafting has stopped paying. Slots whose rows were
        missed while asleep do not draft again."""
        if not self.is_asleep:
            self.is_asleep = True
            self.taps(False)

    def wake(self) -> None:
        if self.is_asleep:
            self.is_asleep = False
            self.taps(True)

    def on_copy(self, src_slot: int, dst_slot: int) -> None:
        """The target copied a slot's KV into another: the draft KV and the rows follow."""
        self.context.kv_copy(src_slot, dst_slot, -1, -1)
        self._cached[dst_slot] = list(self._cached.get(src_slot, []))
        self.rows.copy(src_slot, dst_slot)

    def _catch_up(self, jobs: list[DraftJob]) -> tuple[np.ndarray, np.ndarray]:
        """Feed each slot what its draft KV lacks, up to the token to draft from; the first drafts'
        logits and the drafter's hidden rows for them (a row per job)."""
        todo: dict[int, list[int]] = {}
        for job in jobs:
            cached = self._cached.setdefault(job.slot_id, [])
            n_common = self._n_common(job.slot_id, job.context_ids)
            self.context.kv_remove(job.slot_id, n_common, -1)
            del cached[n_common:]
            todo[job.slot_id] = job.context_ids[n_common + self.shift :]
        capacity = self._batch.n_tokens_max
        # long catch-ups (a new prompt) go in chunks; a graph that computes every row's logits
        # (EAGLE3's) gets the rows before each last one in batches of their own, without outputs
        while sum(len(t) for t in todo.values()) > (len(todo) if self.all_logits else capacity):
            feeds, room = [], capacity
            for slot_id, tokens in todo.items():
                n = min(len(tokens) - 1, room)
                if n > 0:
                    feeds.append((slot_id, tokens[:n]))
                    todo[slot_id] = tokens[n:]
                    room -= n
            self._feed(feeds, last_logits=False)
            self.context.decode(self._batch)
        lasts = self._feed([(job.slot_id, todo[job.slot_id]) for job in jobs], last_logits=True)
        logits = self.context.decode(self._batch)
        # (one logits row each: with all_logits the rows before each last one went first)
        return logits[[row for row, _ in lasts]], self.context.hidden(self._batch.n_tokens)[[i for _, i in lasts]]

    def _feed(self, feeds: list[tuple[int, list[int]]], last_logits: bool) -> list[tuple[int, int]]:
        """A fresh batch of these slots' tokens with their input rows (the last of each outputting
        logits where asked); per feed, its first logits row and its last token's batch index."""
        spans = []
        for slot_id, tokens in feeds:
            first = len(self._cached[slot_id]) + self.shift  # the context index of the first token
            spans.append((slot_id, first, first + len(tokens)))
        self._batch.clear()
        lasts = []
        for (slot_id, tokens), embd in zip(feeds, self.inputs_of(spans)):
            cached = self._cached[slot_id]
            n_logits = (len(tokens) if self.all_logits else 1) if last_logits else 0
            lasts.append((self._batch.add(slot_id, tokens, len(cached), n_logits, embd=embd), self._batch.n_tokens - 1))
            cached.extend(tokens)
        return lasts

    def close(self) -> None:
        self.target.tap = None
        self.context.close()
