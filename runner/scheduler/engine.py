"""The engine: one step = plan one batch, one llama_decode, sample and stream every row."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import numpy as np

from runner.scheduler.batch import BatchPlan, BatchRow, MediaRow
from runner.scheduler.beam import BeamSearch
from runner.scheduler.draft_stage import DraftStage, compose
from runner.scheduler.engine_stats import EngineStats
from runner.scheduler.group import ALONE, Choices, Group
from runner.scheduler.jump_forward import JumpForward
from runner.scheduler.request import EventSink, GenerationRequest
from runner.scheduler.scheduler import Scheduler
from runner.scheduler.sequence import Sequence
from runner.scheduler.snapshot import EngineSnapshot, SlotDrafts, SlotSnapshot
from runner.scheduler.speculation_stage import Speculation, SpeculationStage


class Runtime(Protocol):
    n_padding_tokens: int  # junk tokens decoded to keep batches invariant (0 where it never pads)

    def decode(self, rows: list[BatchRow]) -> list[np.ndarray]: ...  # each row's logits rows, in row order
    def kv_remove(self, seq_id: int, p0: int = 0, p1: int = -1) -> bool: ...
    def decode_media(self, seq_id: int, first_pos: int, item: object) -> None: ...  # an image span into a KV


class Vocab(Protocol):
    def token_bytes(self, token_id: int) -> bytes: ...
    @property
    def eog_ids(self) -> frozenset[int]: ...


class Engine:
    def __init__(self, runtime: Runtime, scheduler: Scheduler, vocab: Vocab,
                 speculator: Speculation | None = None, clock: Callable[[], float] = time.perf_counter,
                 jump_forward: bool = True) -> None:
        self.runtime = runtime
        self.clock = clock  # seconds; tests inject one so that nothing depends on the machine's speed
        self.scheduler = scheduler
        self.vocab = vocab
        self.speculator = speculator
        self.stats = EngineStats(step_times=scheduler.step_times)
        self.jump_forward = jump_forward  # (sets self.drafts)
        if speculator is not None:
            scheduler.on_kv_copy = speculator.on_copy

    @property
    def jump_forward(self) -> bool:
        return self._jump_forward

    @jump_forward.setter
    def jump_forward(self, on: bool) -> None:  # (bench/structured.py compares runs with it on and off)
        self._jump_forward = on
        self.drafts = self._draft_stage()

    def _draft_stage(self) -> DraftStage:
        """The speculator's drafts first; then a grammar's forced tokens in the rows it left without."""
        n_batch, n_ctx_per_slot = self.scheduler.n_batch, self.scheduler.n_ctx_per_slot
        stages: list[DraftStage] = []
        if self.speculator is not None:
            stages.append(SpeculationStage(self.speculator, n_batch, n_ctx_per_slot))
        if self._jump_forward:
            stages.append(JumpForward(n_batch, n_ctx_per_slot))
        return compose(stages)

    def submit(self, request: GenerationRequest, sink: EventSink) -> Sequence:
        return self.submit_group([request], [sink])[0]

    def submit_group(self, requests: list[GenerationRequest], sinks: list[EventSink]) -> list[Sequence]:
        """Several generations of one prompt (n choices): the first computes the prompt, the others
        start from a copy of its KV once it is there, each in its own slot with its own sampler."""
        seqs = [Sequence(r, sink, self.vocab.token_bytes, self.vocab.eog_ids, self.stats.count_finish)
                for r, sink in zip(requests, sinks, strict=True)]
        group = self._group(seqs)
        for seq in seqs:
            seq.group = group
        self.scheduler.submit_group(seqs)
        self.stats.n_requests += 1
        return seqs

    def _group(self, seqs: list[Sequence]) -> Group[Sequence]:
        """How the scheduler treats them together (group.py): one beam search, n choices, or one alone."""
        beam = seqs[0].request.beam
        if beam is not None:  # the group's requests are one beam search's beams
            return BeamSearch(seqs, beam.length_penalty, beam.early_stopping, self.vocab.token_bytes)
        return Choices(seqs[0]) if len(seqs) > 1 else ALONE

    def cancel(self, request_id: str) -> None:
        self.scheduler.cancel(request_id)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def snapshot(self) -> EngineSnapshot:
        """A frozen copy of the counters and the slot table (call it on the engine's own thread)."""
        stats, scheduler = self.stats, self.scheduler
        drafts = self.speculator.counts() if self.speculator is not None else None
        slots = []
        for slot in scheduler.pool.slots:
            seq = slot.seq
            spec = drafts.slots[slot.id] if drafts is not None else SlotDrafts()
            acceptance = round(spec.n_accepted / spec.n_proposed, 4) if spec.n_proposed else None
            slots.append(SlotSnapshot(slot.id, slot.state.value, seq.request_id if seq else None, slot.n_cached,
                                      len(seq.output_ids) if seq else 0, slot.n_prompt, slot.n_prompt_reused,
                                      spec.k, acceptance))
        return EngineSnapshot(tuple(slots), scheduler.n_waiting, stats.n_requests, stats.n_prompt_tokens,
                              stats.n_cached_prompt_tokens, scheduler.n_copied_prompt_tokens,
                              stats.n_generated_tokens, stats.n_steps, stats.decode_s,
                              self.runtime.n_padding_tokens, stats.n_forced_tokens, drafts,
                              tuple((reason.value, n) for reason, n in stats.n_finished.items()))

    def step(self) -> int:
        """Run one engine step; returns the number of tokens decoded."""
        started = self.clock()
        plan = self.scheduler.schedule()
        if plan.is_empty:
            return 0
        if plan.media is not None:
            self._decode_media(plan.media)
            if not plan.rows:
                return plan.media.span.n_tokens
        self.drafts.propose(plan)
        logits, decode_s = self._decode(plan)
        if logits is None:  # the decode failed: the plan's requests ended with its error
            return 0
        self.scheduler.postprocess(plan, logits)
        self.stats.record(plan, decode_s)
        self.drafts.learn(plan, self.clock() - started)
        return plan.n_tokens

    def _decode_media(self, row: MediaRow) -> None:
        """The step's image: encoded (unless cached) and decoded into its slot's KV, its own decode.
        A failure ends that request only."""
        try:
            self.runtime.decode_media(row.seq_id, row.first_pos, row.span.item)
        except (RuntimeError, ValueError) as exc:
            self.scheduler.fail_media(row, str(exc))
            return
        self.scheduler.take_media(row)
        self.stats.record_media(row)

    def _decode(self, plan: BatchPlan) -> tuple[list[np.ndarray] | None, float]:
        """The plan's one llama_decode: each row's logits (None where it failed: then the plan's
        requests end with its error, and their KV is no longer trusted) and the seconds it took."""
        started = self.clock()
        try:
            logits = self.runtime.decode(plan.rows)
        except RuntimeError as exc:
            self.scheduler.fail(plan, str(exc))
            return None, 0.0
        return logits, self.clock() - started
