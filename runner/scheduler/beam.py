"""Beam search on the slot engine: a request's n beams live in n slots and decode in the step's one
batch like any row. After each step, every live beam's logits are scored together: the best n
continuations (by summed log-probability) become the next beams; a beam continued by another's
child gets a copy of that parent's KV. A hypothesis ends at end-of-generation or max_tokens, and
the n best by length-normalized score (sum / length ** length_penalty) are returned, best first.

Deterministic (no sampling, no temperature), never speculated; the logprobs are the model's own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from runner.scheduler.detokenizer import Detokenizer
from runner.scheduler.group import GroupSlot, KvCopy
from runner.scheduler.request import FinishReason, GenerationRequest, StreamEvent, TokenLogprob, Usage
from runner.scheduler.sequence import Sequence

Top = tuple[tuple[int, float], ...]  # the most likely tokens at a position, with their logprobs


@dataclass
class Hypothesis:
    token_ids: list[int]
    logprobs: list[float]
    tops: list[Top]
    finish_reason: FinishReason
    end_logprob: float = 0.0  # the end-of-generation token's, when it ended there (counted in the score)

    def score(self, length_penalty: float) -> float:
        ended = self.finish_reason is FinishReason.STOP
        length = max(1, len(self.token_ids) + ended)
        return (sum(self.logprobs) + self.end_logprob) / length ** length_penalty


@dataclass
class Beam:
    slot: GroupSlot
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[Top] = field(default_factory=list)

    @property
    def total(self) -> float:
        return sum(self.logprobs)

    def child(self, slot: GroupSlot, token: int, logprob: float, top: Top) -> Beam:
        return Beam(slot, self.token_ids + [token], self.logprobs + [logprob], self.tops + [top])


def log_softmax(row: np.ndarray) -> np.ndarray:
    x = row.astype(np.float64)
    top = x.max()
    return x - top - np.log(np.exp(x - top).sum())


class BeamSearch:
    """One request's beams, and their group (group.Group): admitted when all its slots are free, it
    parks the other beams beside the first; the scheduler hands it each step's rows (`collect`),
    then `advance`s it once per step, after every row of the step was seen. A cancel or a failure
    of one beam ends them all."""

    decides_together = True

    def __init__(self, seqs: list[Sequence], length_penalty: float, early_stopping: bool,
                 token_bytes: Callable[[int], bytes]) -> None:
        self.seqs = seqs  # seqs[0] computes the prompt; the others' slots wait parked until it has
        self.width = len(seqs)
        self.length_penalty = length_penalty
        self.early_stopping = early_stopping
        self.token_bytes = token_bytes
        self.beams: list[Beam] = []
        self.finished: list[Hypothesis] = []
        self._rows: dict[int, np.ndarray] = {}  # slot id -> this step's logits row
        self.slots: list[GroupSlot] = []  # the group's slots, the first beam's first (set when admitted)
        self.is_done = False

    @property
    def request(self) -> GenerationRequest:  # the head's
        return self.seqs[0].request

    @property
    def slot_ids(self) -> tuple[int, ...]:
        return tuple(slot.id for slot in self.slots)

    def can_admit(self, seq: Sequence, n_free_slots: int) -> bool:
        return n_free_slots >= self.width  # it starts with all its slots (first come, first served: it waits)

    def start(self, slot: GroupSlot, park: Callable[[Sequence], GroupSlot]) -> None:
        """The first beam took `slot` to compute the prompt; the others' slots wait parked (no rows)
        until its first step, when each gets a copy of a parent's KV."""
        self.slots = [slot] + [park(seq) for seq in self.seqs[1:]]

    def cancel(self) -> None:
        for seq in self.seqs:  # one beam's cancel ends the whole search
            seq.is_cancel_requested = True

    def collect(self, slot: GroupSlot, row: np.ndarray) -> None:
        self._rows[slot.id] = row

    def advance(self, kv: KvCopy, n_ctx_per_slot: int) -> list[GroupSlot]:
        """Choose the next beams from this step's rows; returns the slots to release (all of them
        once the search ends)."""
        slots = self.slots
        if not self._rows:
            return []
        parents = self.beams or [Beam(slots[0])]  # the first step: the prompt's one row
        eog = self.seqs[0].eog_ids
        n_top = self.request.n_top_logprobs or 0
        candidates: list[tuple[float, int, int, float]] = []  # (total, parent index, token, logprob)
        tops: list[Top] = []  # per parent: its position's most likely tokens (when logprobs were asked)
        for p, beam in enumerate(parents):
            lp = log_softmax(self._rows[beam.slot.id])
            best = np.argpartition(lp, -2 * self.width)[-2 * self.width:]
            candidates.extend((beam.total + float(lp[t]), p, int(t), float(lp[t])) for t in best)
            ranked = np.argsort(-lp, kind="stable")[:n_top] if n_top else []
            tops.append(tuple((int(t), float(lp[t])) for t in ranked))
        self._rows.clear()
        candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
        chosen = []
        for _, p, token, lp in candidates:
            parent = parents[p]
            if token in eog:  # a finished hypothesis (only while it ranks among the best n)
                if len(chosen) < self.width:
                    self.finished.append(Hypothesis(list(parent.token_ids), list(parent.logprobs), list(parent.tops),
                                                    FinishReason.STOP, lp))
                continue
            chosen.append((p, token, lp, tops[p]))
            if len(chosen) == self.width:
                break
        n_done = len(parents[0].token_ids) + 1
        max_tokens = self.request.max_tokens
        if self._should_stop(chosen, parents, n_done, max_tokens, slots[0], n_ctx_per_slot):
            for p, token, lp, top in chosen:
                child = parents[p].child(parents[p].slot, token, lp, top)
                self.finished.append(Hypothesis(child.token_ids, child.logprobs, child.tops, FinishReason.LENGTH))
            self._finish()
            return list(slots)
        self.beams = self._place(chosen, parents, slots, kv)
        return []

    def _should_stop(self, chosen: list[tuple[int, int, float, Top]], parents: list[Beam], n_done: int, max_tokens: int,
                     slot: GroupSlot, n_ctx_per_slot: int) -> bool:
        if n_done >= max_tokens or slot.n_cached + 2 >= n_ctx_per_slot or not chosen:
            return True
        if len(self.finished) < self.width:
            return False
        if self.early_stopping:
            return True
        # no live beam can still beat the worst of the best n finished (its score only falls from here
        # when length_penalty <= 1: log-probabilities are negative)
        worst = sorted((h.score(self.length_penalty) for h in self.finished), reverse=True)[self.width - 1]
        best_live = max(parents[p].total + lp for p, _, lp, _ in chosen) / n_done ** self.length_penalty
        return best_live < worst

    def _place(self, chosen: list[tuple[int, int, float, Top]], parents: list[Beam], slots: list[GroupSlot],
               kv: KvCopy) -> list[Beam]:
        """The new beams in the group's slots: a parent's first child stays in its slot; each other
        child takes a slot whose beam has no child, with a copy of its parent's KV."""
        kept: dict[int, Beam] = {}
        copies: list[tuple[Beam, int, float, Top]] = []
        for p, token, lp, top in chosen:
            parent = parents[p]
            if parent.slot.id not in kept:
                kept[parent.slot.id] = parent.child(parent.slot, token, lp, top)
            else:
                copies.append((parent, token, lp, top))
        free = [s for s in slots if s.id not in kept]
        new = list(kept.values())
        for (parent, token, lp, top), slot in zip(copies, free):
            kv.kv_remove(slot.id, 0, -1)
            kv.kv_copy_all(parent.slot.id, slot.id)
            slot.replace(parent.slot.cached_ids)
            new.append(parent.child(slot, token, lp, top))
        for beam in new:
            beam.slot.next_token = beam.token_ids[-1]
        return new

    def _finish(self) -> None:
        """The n best hypotheses, best first, each to one of the group's requests as its whole reply."""
        self.is_done = True
        ranked = sorted(self.finished, key=lambda h: -h.score(self.length_penalty))[: self.width]
        n_prompt = len(self.seqs[0].prompt_ids)
        for seq, hyp in zip(self.seqs, ranked, strict=False):
            detokenizer = Detokenizer(self.token_bytes, ())
            text = "".join(detokenizer.push(t) for t in hyp.token_ids) + detokenizer.flush()
            logprobs = tuple(TokenLogprob(t, lp, top)
                             for t, lp, top in zip(hyp.token_ids, hyp.logprobs, hyp.tops, strict=True))
            seq.output_ids = list(hyp.token_ids)
            seq.finish_reason = hyp.finish_reason
            seq.sink(StreamEvent(seq.request_id, text, tuple(hyp.token_ids), (False,) * len(hyp.token_ids), logprobs,
                                 hyp.finish_reason, Usage(n_prompt, len(hyp.token_ids), seq.n_cached_prompt)))
        for seq in self.seqs[len(ranked):]:  # (fewer hypotheses than beams: only when nothing could continue)
            seq.finish(FinishReason.STOP)
