"""The scheduler: FIFO queue, slot admission with prefix reuse, and one batch plan per step.

It never imports the model runtime: KV edits go through the small `KvOps` protocol, so a
fake runtime tests it without a model.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol

import numpy as np

from runner.core.errors import RunnerError
from runner.sampling.constraints import prefetch_masks
from runner.scheduler.batch import BatchPlan, BatchRow, MediaRow, RowKind
from runner.scheduler.group import Group
from runner.scheduler.request import FinishReason, media_placeholder
from runner.scheduler.sequence import Sequence
from runner.scheduler.slots import Placement, Slot, SlotPool, SlotState
from runner.scheduler.step_times import StepTimes

MAX_PASSED_OVER = 4  # a prompt passed over this many steps for shorter ones goes first


def _score_prompt(row: BatchRow, seq: Sequence, rows: np.ndarray) -> np.ndarray:
    """The row's first logits score prompt tokens (where the request asked for prompt logprobs);
    returns the logits after them."""
    if not row.n_prompt_logits:
        return rows
    seq.score_prompt(row.first_pos, rows[: row.n_prompt_logits])
    return rows[row.n_prompt_logits :]


class QueueFullError(RunnerError):
    """More requests are waiting than --max-queue allows."""


class PromptTooLongError(RunnerError):
    """The prompt does not fit in one slot's context."""

    def __init__(self, message: str, n_tokens: int = 0, n_max: int = 0) -> None:
        super().__init__(message)
        self.n_tokens, self.n_max = n_tokens, n_max  # its tokens (or the fewest it has), and the most a slot takes


def check_prompt_length(n_prompt: int, n_ctx_per_slot: int) -> None:
    """PromptTooLongError for an empty prompt, or one that leaves a slot no room to generate."""
    if n_prompt == 0:
        raise PromptTooLongError("the prompt is empty: at least one token is needed")
    if n_prompt >= n_ctx_per_slot:
        raise PromptTooLongError(
            f"the prompt has {n_prompt} tokens but a slot's context holds {n_ctx_per_slot} "
            f"(at least one more is needed to generate); raise --ctx-size or shorten the prompt",
            n_prompt, n_ctx_per_slot - 1,
        )


class KvOps(Protocol):
    def kv_remove(self, seq_id: int, p0: int = 0, p1: int = -1) -> bool: ...
    def kv_copy_all(self, src_seq: int, dst_seq: int) -> None: ...
    def usable_prefix(self, seq_id: int, n_keep: int, copied: bool = False) -> int: ...
    def checkpoint(self, seq_id: int, n_tokens: int) -> None: ...


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
        check_prompt_length(n_prompt, self.n_ctx_per_slot)

    def is_queue_full(self, n_arriving: int = 0) -> bool:
        """Would one more request (after n_arriving not yet submitted) wait beyond --max-queue?"""
        return len(self.waiting) + n_arriving - self.pool.n_free >= self.max_queue

    def submit(self, seq: Sequence) -> None:
        self.submit_group([seq])

    def submit_group(self, seqs: list[Sequence]) -> None:
        """Queue sequences together (a request's n choices): all of them, or none when the queue is full."""
        for seq in seqs:
            self.check_prompt(len(seq.prompt_ids))
        if self.is_queue_full(len(seqs) - 1):
            raise QueueFullError(f"the queue is full ({self.max_queue} generations waiting: each choice, beam and "
                                 "prompt of a request is one)")
        self.waiting.extend(seqs)

    def cancel(self, request_id: str) -> None:
        for seq in self._live_seqs():
            if seq.request_id == request_id:
                self._mark_cancelled(seq)

    def cancel_all(self, reason: str | None = None) -> None:
        """Cancel every request, waiting or running; `reason`: the error their final events carry."""
        for seq in self._live_seqs():
            seq.is_cancel_requested = True
            seq.cancel_reason = reason

    def _live_seqs(self) -> list[Sequence]:
        return list(self.waiting) + [slot.seq for slot in self.pool.active() if slot.seq is not None]

    @staticmethod
    def _mark_cancelled(seq: Sequence) -> None:
        seq.is_cancel_requested = True
        seq.group.cancel()  # (a group that ends whole marks the others)

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
                plan.add(BatchRow(slot, [slot.next_token], slot.n_cached, 1))
                budget -= 1
        for slot in self._prefill_slots(budget):
            seq = slot.seq
            assert seq is not None
            span = seq.request.next_media(slot.n_cached)
            if span is not None and span.start == slot.n_cached:  # an image is next: its own decode
                if plan.media is None:
                    plan.media = MediaRow(slot, span)
                continue
            n_chunk = min(slot.n_prompt_left, budget)
            if span is not None:  # text up to the next image
                n_chunk = min(n_chunk, span.start - slot.n_cached)
            chunk = list(seq.prompt_ids[slot.n_cached : slot.n_cached + n_chunk])
            is_last = n_chunk == slot.n_prompt_left
            # each position's logits predict the next prompt token (the last one's: the reply's first)
            n_scored = (n_chunk - is_last) if seq.request.prompt_logprobs is not None else 0
            kind = (RowKind.PROMPT if not is_last else RowKind.PROMPT_ONLY if seq.request.max_tokens == 0
                    else RowKind.PROMPT_END)
            plan.add(BatchRow(slot, chunk, slot.n_cached, n_scored + is_last, n_prompt_logits=n_scored, kind=kind))
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
        free slots. A row whose sampling or detokenizing raises fails its own request only. A group
        that decides its members' tokens together (a beam search) does so once all its rows are in."""
        if plan.constrained:
            self._prefetch_masks(plan.constrained)
        deciding: dict[int, Group[Sequence]] = {}
        for row, rows in zip(plan.rows, logits, strict=True):
            try:
                self._take(row, rows, deciding)
            except Exception as exc:  # noqa: BLE001 - contained: the other rows' requests go on
                self._drop(row.slot, f"internal error: {type(exc).__name__}: {exc}")
        for group in deciding.values():
            try:
                self._advance(group)
            except Exception as exc:  # noqa: BLE001
                self._drop(self.pool.slots[group.slot_ids[0]], f"internal error: {type(exc).__name__}: {exc}")

    def take_media(self, row: MediaRow) -> None:
        """The image's span is in its slot's KV."""
        row.slot.append([media_placeholder(row.span.key)] * row.span.n_tokens)

    def fail_media(self, row: MediaRow, message: str) -> None:
        self._drop(row.slot, message)

    @staticmethod
    def _prefetch_masks(constrained: list[BatchRow]) -> None:
        """The masks that this step's sampling will ask the grammars for, computed together."""
        prefetch_masks([c for row in constrained
                        if row.n_logits and (c := row.slot.seq.request.constraint).is_active])

    def _take(self, row: BatchRow, rows: np.ndarray, deciding: dict[int, Group[Sequence]]) -> None:
        seq = row.slot.seq
        assert seq is not None
        if seq.group.decides_together:
            self._collect(row, rows, seq.group, deciding)
        else:
            self._TAKE[row.kind](self, row, seq, rows)

    @staticmethod
    def _collect(row: BatchRow, rows: np.ndarray, group: Group[Sequence], deciding: dict[int, Group[Sequence]]) -> None:
        """A row of a group that decides together: its fed tokens are in the KV; the group decides
        what follows once the step's rows are all in."""
        row.slot.append(row.token_ids)
        if row.n_logits:
            group.collect(row.slot, rows[-1])
            deciding[id(group)] = group

    def _take_prompt(self, row: BatchRow, seq: Sequence, rows: np.ndarray) -> None:
        """A prompt chunk is in the KV (its logits, where the request asked, scored its tokens)."""
        _score_prompt(row, seq, rows)
        row.slot.append(row.token_ids)

    def _take_prompt_only(self, row: BatchRow, seq: Sequence, rows: np.ndarray) -> None:
        """Scoring only: the prompt is in, nothing is generated."""
        self._take_prompt(row, seq, rows)
        seq.finish(FinishReason.LENGTH)
        self.pool.release(row.slot)

    def _take_prompt_end(self, row: BatchRow, seq: Sequence, rows: np.ndarray) -> None:
        """The prompt's last chunk: its last logits give the reply's first token."""
        rows = _score_prompt(row, seq, rows)
        self._kv.checkpoint(row.slot.id, row.slot.n_cached + len(row.token_ids))  # (a prompt's rows carry no drafts)
        row.slot.state = SlotState.GENERATING
        self._take_tokens(row, seq, rows)

    def _take_tokens(self, row: BatchRow, seq: Sequence, rows: np.ndarray) -> None:
        """Sample the row's next token, verifying its drafts first; rejected drafts leave the KV."""
        slot = row.slot
        n_fed = len(row.token_ids) - len(row.draft_ids)  # tokens that enter the KV for sure
        n_ctx_left = self.n_ctx_per_slot - (slot.n_cached + n_fed) - 1
        row.n_accepted, row.n_decided, slot.next_token = seq.take_tokens(rows, row.draft_ids, n_ctx_left)
        n_kept = n_fed + row.n_accepted
        if n_kept < len(row.token_ids):
            self._kv.kv_remove(slot.id, slot.n_cached + n_kept, -1)
        slot.append(row.token_ids[:n_kept])
        if seq.is_finished:
            self.pool.release(slot)

    # a row's logits go to the method for its kind, decided when the row was planned
    _TAKE = {RowKind.PROMPT: _take_prompt, RowKind.PROMPT_END: _take_prompt_end,
             RowKind.PROMPT_ONLY: _take_prompt_only, RowKind.NEXT_TOKEN: _take_tokens}

    def _advance(self, group: Group[Sequence]) -> None:
        """The group chose its members' next tokens: the slots it is done with are freed, the others
        decode them (a group knows the slots by id, which is their index in the pool)."""
        for slot in group.advance(self._kv, self.n_ctx_per_slot):
            self.pool.release(self.pool.slots[slot.id])
        if not group.is_done:
            for slot_id in group.slot_ids:
                self.pool.slots[slot_id].state = SlotState.GENERATING

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
        """End the slot's request with an error (a group that holds its slots as one: all of them) and
        forget its KV."""
        group_ids = slot.seq.group.slot_ids if slot.seq is not None else ()
        for each in [self.pool.slots[i] for i in group_ids] or [slot]:
            if each.seq is not None and not each.seq.is_finished:
                each.seq.finish(FinishReason.ERROR, error=message)
            self._kv.kv_remove(each.id, 0, -1)
            each.truncate(0)
            self.pool.release(each)

    def _reap_cancelled(self) -> None:
        if any(seq.is_cancel_requested for seq in self.waiting):
            for seq in [s for s in self.waiting if s.is_cancel_requested]:
                seq.finish(FinishReason.CANCELLED, error=seq.cancel_reason)
            self.waiting = deque(s for s in self.waiting if not s.is_finished)
        for slot in self.pool.active():
            if slot.seq is not None and slot.seq.is_cancel_requested:
                slot.seq.finish(FinishReason.CANCELLED, error=slot.seq.cancel_reason)
                self.pool.release(slot)

    def _admit(self) -> None:
        while self.waiting and self.pool.has_free():
            seq = self.waiting[0]
            if not seq.group.can_admit(seq, self.pool.n_free):
                break  # first come, first served: nothing overtakes it
            # placed before it leaves the queue: where the runtime cannot set up its KV (a checkpoint
            # that would not restore) it is still there for the step's failure (fail_all) to end
            slot = self._place(seq)
            self.waiting.popleft()
            seq.group.start(slot, self._park)

    def _place(self, seq: Sequence) -> Slot:
        """A free slot for seq, holding the longest cached prefix of its prompt found in any slot."""
        place = self.pool.place(seq.prompt_ids)
        # every prompt position's logits wanted (prompt logprobs): compute it all
        n_keep = 0 if seq.request.prompt_logprobs is not None else self._continuable(seq, place)
        slot, copy_from = place.slot, place.copy_from if n_keep else None
        if copy_from is not None:  # another slot (maybe busy) holds the prefix: copy its KV
            self._kv.kv_copy_all(copy_from.id, slot.id)
            if self.on_kv_copy is not None:
                self.on_kv_copy(copy_from.id, slot.id)
            slot.replace(copy_from.cached_ids)
            self.n_copied_prompt_tokens += n_keep
        if n_keep < slot.n_cached:
            self._kv.kv_remove(slot.id, n_keep, -1)
            slot.truncate(n_keep)
        seq.n_cached_prompt = n_keep
        self.pool.occupy(slot, seq, n_keep)
        return slot

    def _continuable(self, seq: Sequence, place: Placement) -> int:
        """How much of the placement's cached prefix the prompt continues: whole images only, and what
        the runtime can still continue from (sliding-window layers may have let go of it)."""
        n_keep = seq.request.media_start_before(place.n_keep)
        usable = self._kv.usable_prefix((place.copy_from or place.slot).id, n_keep, copied=place.copy_from is not None)
        return usable if seq.request.media_start_before(usable) == usable else 0

    def _park(self, seq: Sequence) -> Slot:
        """A slot for a member of a group that starts whole: it waits there, empty and without rows,
        until the group's first step (the least recently used free slot)."""
        self.waiting.remove(seq)
        slot = min((s for s in self.pool.slots if s.is_free), key=lambda s: s.last_used)
        self._kv.kv_remove(slot.id, 0, -1)
        slot.truncate(0)
        self.pool.occupy(slot, seq, 0)
        slot.state = SlotState.PARKED
        return slot
