"""The draws of drafters that sample (a draft model, MTP, EAGLE3): per slot, a sampler of the
request's parameters on a stream of its own, independent of the target's draws (the rejection
rule needs that)."""

from __future__ import annotations

import dataclasses

import numpy as np

from runner.sampling.sampler import Distribution, Sampler
from runner.speculation.drafter import DraftJob

DRAFT_SEED_OFFSET = 0x9E3779B97F4A7C15


class DraftSamplers:
    def __init__(self) -> None:
        self._samplers: dict[int, tuple[str, Sampler]] = {}  # per slot: (request id, its draft sampler)

    def draw(self, job: DraftJob, logits: np.ndarray) -> tuple[int, Distribution | None]:
        """The job's next draft token from these logits, and the distribution it was drawn from
        (None: a point mass, as under greedy decoding)."""
        sampler = self._sampler(job)
        dist = sampler.distribution(logits)
        if len(dist.token_ids) == 1:
            return int(dist.token_ids[0]), None
        return sampler.draw(dist), dist

    def _sampler(self, job: DraftJob) -> Sampler:
        held = self._samplers.get(job.slot_id)
        if held is None or held[0] != job.request_id:
            seed = job.sampling.seed
            params = dataclasses.replace(job.sampling, seed=None if seed is None else (seed + DRAFT_SEED_OFFSET) % 2**64)
            held = self._samplers[job.slot_id] = (job.request_id, Sampler(params))
        return held[1]
