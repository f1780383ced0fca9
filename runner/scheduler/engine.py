"""The engine: one step = plan one batch, one llama_decode, sample and stream every row."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from runner.constraints import prefetch_masks
from runner.scheduler.batch import BatchPlan, BatchRow
from runner.scheduler.beam import BeamSearch
from runner.scheduler.request import EventSink, GenerationRequest
from runner.scheduler.scheduler import Scheduler
from runner.scheduler.sequence import Sequence
from runner.scheduler.slots import SlotState


class Runtime(Protocol):
    def decode(self, rows: list[BatchRow]) -> list[np.ndarray]: ...  # each row's logits rows, in row order
    def kv_remove(self, seq_id: int, p0: int = 0, p1: int = -1) -> bool: ...


class Speculation(Protocol):
    """What the step loop asks of speculative decoding (speculation.speculator.Speculator)."""

    def draft(self, plan: BatchPlan, n_batch: int, n_ctx_per_slot: int) -> None: ...
    def learn(self, plan: BatchPlan, step_s: float) -> None: ...
    def on_copy(self, src_slot: int, dst_slot: int) -> None: ...


class Vocab(Protocol):
    def token_bytes(self, token_id: int) -> bytes: ...
    @property
    def eog_ids(self) -> frozenset[int]: ...


@dataclass
class EngineStats:
    n_requests: int = 0
    n_prompt_tokens: int = 0  # prompt tokens computed (not reused)
    n_cached_prompt_tokens: int = 0
    n_generated_tokens: int = 0  # sampled by the target, accepted drafts included
    n_steps: int = 0
    decode_s: float = 0.0
    n_forced_tokens: int = 0  # put in rows by jump-forward (constrained requests)


class Engine:
    def __init__(self, runtime: Runtime, scheduler: Scheduler, vocab: Vocab,
                 speculator: Speculation | None = None, clock: Callable[[], float] = time.perf_counter,
                 jump_forward: bool = True) -> None:
        self.runtime = runtime
        self.clock = clock  # seconds; tests inject one so that nothing depends on the machine's speed
        self.jump_forward = jump_forward
        self.scheduler = scheduler
        self.vocab = vocab
        self.speculator = speculator
        self.stats = EngineStats()
        if speculator is not None:
            scheduler.on_kv_copy = speculator.on_copy

    def submit(self, request: GenerationRequest, sink: EventSink) -> Sequence:
        return self.submit_group([request], [sink])[0]

    def submit_group(self, requests: list[GenerationRequest], sinks: list[EventSink]) -> list[Sequence]:
        """Several generations of one prompt (n choices): the first computes the prompt, the others
        start from a copy of its KV once it is there, each in its own slot with its own sampler."""
        seqs = [Sequence(r, sink, self.vocab.token_bytes, self.vocab.eog_ids) for r, sink in zip(requests, sinks,
                                                                                                 strict=True)]
        beam = requests[0].beam
        if beam is not None:  # the group's requests are one beam search's beams
            search = BeamSearch(seqs, beam.length_penalty, beam.early_stopping, self.vocab.token_bytes)
            for seq in seqs:
                seq.beam = search
        else:
            for seq in seqs[1:]:
                seq.fork_of = seqs[0]
        self.scheduler.submit_group(seqs)
        self.stats.n_requests += 1
        return seqs

    def cancel(self, request_id: str) -> None:
        self.scheduler.cancel(request_id)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def step(self) -> int:
        """Run one engine step; returns the number of tokens decoded."""
        step_started = self.clock()
        plan = self.scheduler.schedule()
        if plan.is_empty:
            return 0
        if self.speculator is not None:
            self.speculator.draft(plan, self.scheduler.n_batch, self.scheduler.n_ctx_per_slot)
        # rows whose request follows a grammar (none, almost always: then nothing below costs a pass)
        constrained = [r for r in plan.rows if r.slot.seq is not None and r.slot.seq.request.constraint is not None]
        if constrained and self.jump_forward:
            self._jump_forward(plan, constrained)
        started = self.clock()
        try:
            logits = self.runtime.decode(plan.rows)
        except RuntimeError as exc:
            self.scheduler.fail(plan, str(exc))
            return 0
        decode_s = self.clock() - started
        self.stats.decode_s += decode_s
        self.scheduler.step_times.observe(plan.n_tokens, decode_s)
        self.stats.n_steps += 1
        self._count(plan.rows)
        if constrained:
            prefetch_masks([c for row in constrained
                            if row.n_logits and (c := row.slot.seq.request.constraint).is_active])
        self.scheduler.postprocess(plan, logits)
        self.stats.n_generated_tokens += sum(1 + row.n_accepted for row in plan.rows
                                             if row.n_logits > row.n_prompt_logits)
        if self.speculator is not None:
            self.speculator.learn(plan, self.clock() - step_started)
        return plan.n_tokens

    def _jump_forward(self, plan: BatchPlan, constrained: list[BatchRow]) -> None:
        """Where a request's grammar allows exactly one continuation (a schema's fixed keys,
        punctuation), those tokens ride in its row as drafts: verified like any draft (the masked
        target gives them probability 1), so several forced tokens cost one step."""
        room = self.scheduler.n_batch - plan.n_tokens
        for row in constrained:
            seq = row.slot.seq
            if room <= 0 or row.draft_ids or row.slot.state is not SlotState.GENERATING or seq is None:
                continue
            cap = min(room, seq.n_tokens_left - 1, self.scheduler.n_ctx_per_slot - row.slot.n_cached - 2)
            forced = seq.request.constraint.forced_tokens()[: max(0, cap)]
            if forced:
                row.add_drafts(forced, [None] * len(forced), is_forced=True)
                room -= len(forced)
                self.stats.n_forced_tokens += len(forced)

    def _count(self, rows: list[BatchRow]) -> None:
        for row in rows:
            seq = row.slot.seq
            assert seq is not None
            if row.slot.state is SlotState.PREFILL:
                self.stats.n_prompt_tokens += len(row.token_ids)
                if row.first_pos == seq.n_cached_prompt:  # first chunk: the rest came from the cache
                    self.stats.n_cached_prompt_tokens += seq.n_cached_prompt
