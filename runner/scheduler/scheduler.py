"""The scheduler: FIFO queue, slot admission with prefix reuse, and one batch plan per step.

It never imports the model runtime: KV edits go through the small `KvOps` protocol, so a
fake runtime tests it without a model.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol

import numpy as np

from runner.errors import RunnerError
from runner.scheduler.batch import BatchPlan, BatchRow
from runner.scheduler.beam import BeamSearch
from runner.scheduler.request import FinishReason
from runner.scheduler.sequence import Sequence
from runner.scheduler.slots import Placement, Slot, SlotPool, SlotState
from runner.scheduler.step_times import StepTimes

MAX_PASSED_OVER = 4  # a prompt passed over this many steps for shorter ones goes first


class QueueFullError(RunnerError):
    """More requests are waiting than --max-queue allows."""


class PromptTooLongError(RunnerError):
    """The prompt does not fit in one slot's context."""


class KvOps(Protocol):
    def kv_remove(self, seq_id: int, p0: int = 0, p1: int = -1) -> bool: ...
    def kv_copy_all(self, src_seq: int, dst_seq: int) -> None: ...


class Scheduler:
    def __init__(self, n_slots: int, n_ctx_per_slot: int, n_batch: int, max_queue: int, kv: KvOps) -> None:
        if n_batch < n_slots + 1:
            raise ValueError(f"the step token budget ({n_batch}) must exceed the slot count ({n_slots})")
        self.pool = SlotPool(n_slots)
        self.n_ctx_per_slot = n_ctx_per_slot
        self.n_batch = n_batch
        self.max_queue = max_queue
        self.waiting: deque[Sequence] = deque()
        self._kv = kv
        self.n_copied_prompt_tokens = 0  # reused prompt tokens that came from another slot's KV
        self.on_kv_copy: Callable[[int, int], None] | None = None  # e.g. a draft model's KV follows
        self.step_times = StepTimes()  # the engine reports each step's time (_prefill_slots asks it)

    # -- intake -------------------------------------------------------------------------
    def check_prompt(self, n_prompt: int) -> None:
        if n_prompt == 0:
            raise PromptTooLongError("the prompt is empty: at least one token is needed")
        if n_prompt >= self.n_ctx_per_slot:
            raise PromptTooLongError(
                f"the prompt has {n_prompt} tokens but a slot's context holds {self.n_ctx_per_slot} "
                f"(at least one more is needed to generate); raise --ctx-size or shorten the prompt"
            )

    def is_queue_full(self, n_arriving: int = 0) -> bool:
        """Would one more request (after n_arriving not yet submitted) wait beyond --max-queue?"""
        n_free = len(self.pool.slots) - self.pool.n_busy
        return len(self.waiting) + n_arriving - n_free >= self.max_queue

    def submit(self, seq: Sequence) -> None:
        self.submit_group([seq])

    def submit_group(self, seqs: list[Sequence]) -> None:
        """Queue sequences together (a request's n choices): all of them, or none when the queue is full."""
        for seq in seqs:
            self.check_prompt(len(seq.prompt_ids))
        if self.is_queue_full(len(seqs) - 1):
            raise QueueFullError(f"the queue is full ({self.max_queue} requests waiting)")
        self.waiting.extend(seqs)

    def cancel(self, request_id: str) -> None:
        for seq in self._live_seqs():
            if seq.request_id == request_id:
                self._mark_cancelled(seq)

    def cancel_all(self) -> None:
        for seq in self._live_seqs():
            seq.is_cancel_requested = True

    def _live_seqs(self) -> list[Sequence]:
        return list(self.waiting) + [slot.seq for slot in self.pool.active() if slot.seq is not None]

    @staticmethod
    def _mark_cancelled(seq: Sequence) -> None:
        for each in seq.beam.seqs if seq.beam is not None else [seq]:  # one beam's cancel ends the whole search
            each.is_cancel_requested = True

    @property
    def has_work(self) -> bool:
        return bool(self.waiting) or self.pool.n_busy > 0

    @property
    def n_waiting(self) -> int:
        return len(self.waiting)

    # -- one step -----------------------------------------------------------------------
    def schedule(self) -> BatchPlan:
        self._reap_cancelled()
        self._admit()
        plan = BatchPlan()
        budget = self.n_batch
        for slot in self.pool.active():
            if slot.state is SlotState.GENERATING:
                assert slot.next_token is not None
                plan.rows.append(BatchRow(slot, [slot.next_token], slot.n_cached, 1))
                budget -= 1
        for slot in self._prefill_slots(budget):
            assert slot.seq is not None
            n_chunk = min(slot.n_prompt_left, budget)
            chunk = list(slot.seq.prompt_ids[slot.n_cached : slot.n_cached + n_chunk])
            is_last = n_chunk == slot.n_prompt_left
            # each position's logits predict the next prompt token (the last one's: the reply's first)
            n_scored = (n_chunk - is_last) if slot.seq.request.prompt_logprobs is not None else 0
            plan.rows.append(BatchRow(slot, chunk, slot.n_cached, n_scored + is_last, n_prompt_logits=n_scored))
            budget -= n_chunk
        return plan

    def _prefill_slots(self, budget: int) -> list[Slot]:
        """The prompts this step computes (a chunk each, while the budget lasts), for the least
        time to first token summed over them. Shortest first (a prompt passed over MAX_PASSED_OVER
        times goes first). Where a step's time is mostly per token (a small model on a CPU), one
        prompt at a time: the first gets its token after its own tokens, not everyone's. Where it
        is mostly a fixed cost (a GPU), prompts share a step: the next one joins when the time it
        adds, paid by the m prompts already in, is less than the step it saves itself and the r
        behind it: m * added < (1 + r) * fixed. Until step times are known, every prompt in
        arrival order."""
        prefilling = [s for s in self.pool.active() if s.state is SlotState.PREFILL]
        if not prefilling:
            return []
        line = self.step_times.line()
        if line is None:
            order = sorted(prefilling, key=lambda s: s.last_used)
        else:
            order = sorted(prefilling, key=lambda s: (s.n_passed_over < MAX_PASSED_OVER, s.n_prompt_left, s.last_used))
        taken, left = [], budget
        for i, slot in enumerate(order):
            if left <= 0:
                break
            if taken and line is not None:
                added_s = line.per_token_s * min(slot.n_prompt_left, left)
                if len(taken) * added_s >= (len(order) - i) * line.fixed_s:
                    break
            taken.append(slot)
            left -= slot.n_prompt_left
        for slot in order[len(taken):]:
            slot.n_passed_over += 1
        return taken

    def postprocess(self, plan: BatchPlan, logits: list[np.ndarray]) -> None:
        """Record what entered the KV, sample every row's logits (logits[i]: plan.rows[i]'s), finish and
        free slots. A row whose sampling or detokenizing raises fails its own request only. Beam
        searches choose their next beams once all their rows are in."""
        searches: dict[int, BeamSearch] = {}
        for row, rows in zip(plan.rows, logits, strict=True):
            try:
                self._take(row, rows, searches)
            except Exception as exc:  # noqa: BLE001 - contained: the other rows' requests go on
                self._drop(row.slot, f"internal error: {type(exc).__name__}: {exc}")
        for search in searches.values():
            try:
                self._advance(search)
            except Exception as exc:  # noqa: BLE001
                self._drop(search.slots[0], f"internal error: {type(exc).__name__}: {exc}")

    def _advance(self, search: BeamSearch) -> None:
        for slot in search.advance(self._kv, self.n_ctx_per_slot):
            self.pool.release(slot)
        if not search.is_done:
            for slot in search.slots:
                slot.state = SlotState.GENERATING

    def _take(self, row: BatchRow, rows: np.ndarray, searches: dict[int, BeamSearch]) -> None:
        slot, seq = row.slot, row.slot.seq
        assert seq is not None
        if seq.beam is not None:  # the fed tokens are in the KV; the search decides what follows
            slot.append(row.token_ids)
            if row.n_logits:
                seq.beam.collect(slot, rows[-1])
                searches[id(seq.beam)] = seq.beam
            return
        if row.n_prompt_logits:
            seq.score_prompt(row.first_pos, rows[: row.n_prompt_logits])
            rows = rows[row.n_prompt_logits :]
        if row.n_logits == row.n_prompt_logits:  # a prompt chunk, not its last
            slot.append(row.token_ids)
            return
        if seq.request.max_tokens == 0:  # scoring only: the prompt is in, nothing is generated
            slot.append(row.token_ids)
            seq.finish(FinishReason.LENGTH)
            self.pool.release(slot)
            return
        slot.state = SlotState.GENERATING
        n_fed = len(row.token_ids) - len(row.draft_ids)  # tokens that enter the KV for sure
        n_ctx_left = self.n_ctx_per_slot - (slot.n_cached + n_fed) - 1
        row.n_accepted, slot.next_token = seq.take_tokens(rows, row.draft_ids, row.draft_dists, n_ctx_left)
        n_kept = n_fed + row.n_accepted
        if n_kept < len(row.token_ids):  # rejected drafts leave the KV
            self._kv.kv_remove(slot.id, slot.n_cached + n_kept, -1)
        slot.append(row.token_ids[:n_kept])
        if seq.is_finished:
            self.pool.release(slot)

    def fail(self, plan: BatchPlan, message: str) -> None:
        """A decode failed: end the plan's requests with an error; their KV is no longer trusted."""
        for row in plan.rows:
            self._drop(row.slot, message)

    def fail_all(self, message: str) -> None:
        """Something unexpected broke a step: end every request with the error, trust no KV."""
        for seq in self.waiting:
            seq.finish(FinishReason.ERROR, error=message)
        self.waiting.clear()
        for slot in self.pool.slots:
            self._drop(slot, message)

    def _drop(self, slot: Slot, message: str) -> None:
        search = slot.seq.beam if slot.seq is not None else None
        for each in (search.slots if search is not None and search.slots else [slot]):  # a search fails whole
            if each.seq is not None and not each.seq.is_finished:
                each.seq.finish(FinishReason.ERROR, error=message)
            self._kv.kv_remove(each.id, 0, -1)
            each.truncate(0)
            self.pool.release(each)

    def _reap_cancelled(self) -> None:
        if any(seq.is_cancel_requested for seq in self.waiting):
            for seq in [s for s in self.waiting if s.is_cancel_requested]:
                seq.finish(FinishReason.CANCELLED)
            self.waiting = deque(s for s in self.waiting if not s.is_finished)
        for slot in self.pool.active():
            if slot.seq is not None and slot.seq.is_cancel_requested:
                slot.seq.finish(FinishReason.CANCELLED)
                self.pool.release(slot)

    def _admit(self) -> None:
        while self.waiting and self.pool.has_free():
            head = self.waiting[0].fork_of
            if head is not None and not head.is_prompt_computed:
                break  # (first come, first served: nothing overtakes it; its first choice is prefilling)
            search = self.waiting[0].beam
            if search is not None and len(self.pool.slots) - self.pool.n_busy < search.width:
                break  # a beam search starts with all its slots (first come, first served: it waits for them)
            seq = self.waiting.popleft()
            place = self.pool.place(seq.prompt_ids)
            if seq.request.prompt_logprobs is not None:  # every prompt position's logits are wanted: compute it all
                place = Placement(place.slot, 0)
            slot, n_keep = place.slot, place.n_keep
            if place.copy_from is not None:  # another slot (maybe busy) holds the prefix: copy its KV
                self._kv.kv_copy_all(place.copy_from.id, slot.id)
                if self.on_kv_copy is not None:
                    self.on_kv_copy(place.copy_from.id, slot.id)
                slot.replace(place.copy_from.cached_ids)
                self.n_copied_prompt_tokens += n_keep
            if n_keep < slot.n_cached:
                self._kv.kv_remove(slot.id, n_keep, -1)
                slot.truncate(n_keep)
            seq.n_cached_prompt = n_keep
            self.pool.occupy(slot, seq, n_keep)
            if search is not None:
                self._park_beams(search, slot)

    def _park_beams(self, search: BeamSearch, first: Slot) -> None:
        """The search's other beams take their slots now, parked (no rows) until the first beam's
        prompt gives the first step; each then gets a copy of a parent's KV."""
        search.slots = [first]
        for seq in search.seqs[1:]:
            self.waiting.remove(seq)
            slot = min((s for s in self.pool.slots if s.is_free), key=lambda s: s.last_used)
            self._kv.kv_remove(slot.id, 0, -1)
            slot.truncate(0)
            self.pool.occupy(slot, seq, 0)
            slot.state = SlotState.PARKED
            search.slots.append(slot)
