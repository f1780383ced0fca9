"""The draws of drafters that sample (a draft model, MTP, EAGLE3): per slot, a sampler of the
request's parameters with the target's seed, so a draft at a position is drawn with the number
the target then draws that position's token with (sampler.Sampler.draw): where the two models'
distributions agree, so do their tokens."""

from __future__ import annotations

import numpy as np

from runner.sampling.sampler import Sampler
from runner.speculation.drafter import DraftJob


class DraftSamplers:
    def __init__(self) -> None:
        self._samplers: dict[int, tuple[str, Sampler]] = {}  # per slot: (request id, its draft sampler)

    def draw(self, job: DraftJob, logits: np.ndarray) -> int:
        """The job's next draft token from these logits (the token at position len(context) + drafts so far)."""
        sampler = self._sampler(job)
        return sampler.draw(sampler.distribution(logits), len(job.context_ids) + len(job.draft_ids))

    def _sampler(self, job: DraftJob) -> Sampler:
        held = self._samplers.get(job.slot_id)
        if held is None or held[0] != job.request_id:
            held = self._samplers[job.slot_id] = (job.request_id, Sampler(job.sampling))
        return held[1]
