"""A small draft model proposes tokens for all speculating slots together.

It has its own context with one KV sequence per slot. Each step: one batched decode catches
every slot up to its committed tokens (and yields the first draft), then one batched decode
per further draft position. Free order: this drafter's context and model before the target's.
"""

from __future__ import annotations

import numpy as np

from runner.core.errors import ModelLoadError
from runner.runtime.gguf_file import GgufInfo
from runner.runtime.llama import Batch, Context, ContextShape, Model
from runner.speculation.draft_samplers import DraftSamplers
from runner.speculation.drafter import DraftJob, n_common, register_drafter


def check_same_vocab_header(target: GgufInfo, draft: GgufInfo) -> None:
    """The draft's vocabulary is the target's, read from the GGUF headers (before any weights load)."""
    if draft.n_vocab != target.n_vocab:
        raise ModelLoadError(
            f"the draft model {draft.path.name} has a different vocabulary ({draft.n_vocab} tokens) "
            f"from the target {target.path.name} ({target.n_vocab} tokens); pick a draft of the same family"
        )
    if target.vocab_digest != draft.vocab_digest:
        raise ModelLoadError(
            f"the draft model {draft.path.name} has a different vocabulary from the target {target.path.name} "
            f"(as many tokens, {target.n_vocab}, but not the same ones); pick a draft of the same family"
        )


def check_same_vocab(target: Model, draft: Model) -> None:
    if target.n_vocab != draft.n_vocab:
        raise ModelLoadError(
            f"the draft model {draft.path.name} has a different vocabulary ({draft.n_vocab} tokens) "
            f"from the target {target.path.name} ({target.n_vocab} tokens); pick a draft of the same family"
        )
    for token_id in range(target.n_vocab):
        if target.token_text(token_id) != draft.token_text(token_id):
            raise ModelLoadError(
                f"the draft model {draft.path.name} has a different vocabulary from the target "
                f"{target.path.name} (token {token_id}: {target.token_text(token_id)!r} vs "
                f"{draft.token_text(token_id)!r}); pick a draft of the same family"
            )


class ModelDrafter:
    name = "draft-model"
    is_free = False

    def __init__(self, model: Model, shape: ContextShape) -> None:
        self.model = model
        self.context = Context(model, shape)
        self._batch = Batch(max(shape.n_batch, shape.n_seq * 2))
        self._cached: dict[int, list[int]] = {}  # per slot: tokens in the draft KV
        self._samplers = DraftSamplers()

    def propose(self, jobs: list[DraftJob]) -> None:
        jobs = sorted((j for j in jobs if j.k > 0), key=lambda j: j.slot_id)  # slot order: fewer micro-batches
        if not jobs:
            return
        logits = self._catch_up(jobs)
        live = list(range(len(jobs)))
        for depth in range(max(j.k for j in jobs)):
            for row, i in enumerate(live):
                jobs[i].draft_ids.append(self._samplers.draw(jobs[i], logits[row]))
            live = [i for i in live if len(jobs[i].draft_ids) < jobs[i].k]
            if not live:
                break
            self._batch.clear()
            for i in live:  # feed this depth's drafts to get the next depth's logits
                self._feed(jobs[i].slot_id, [jobs[i].draft_ids[-1]], 1)
            logits = self.context.decode(self._batch)

    def _n_common(self, slot_id: int, context_ids: list[int]) -> int:
        """Leading committed tokens the draft KV already holds (the last token is always re-fed)."""
        return n_common(self._cached.get(slot_id, []), context_ids, len(context_ids) - 1)

    def catch_up_len(self, slot_id: int, context_ids: list[int]) -> int:
        return len(context_ids) - self._n_common(slot_id, context_ids)

    def on_copy(self, src_slot: int, dst_slot: int) -> None:
        """The target copied a slot's KV into another: the draft's KV follows."""
        self.context.kv_copy(src_slot, dst_slot, -1, -1)
        self._cached[dst_slot] = list(self._cached.get(src_slot, []))

    def _catch_up(self, jobs: list[DraftJob]) -> np.ndarray:
        """Feed each slot the committed tokens its draft KV lacks; one logits row per job."""
        todo: dict[int, list[int]] = {}
        for job in jobs:
            cached = self._cached.setdefault(job.slot_id, [])
            n_common = self._n_common(job.slot_id, job.context_ids)
            if n_common < len(cached):
                self.context.kv_remove(job.slot_id, n_common, -1)
                del cached[n_common:]
            todo[job.slot_id] = job.context_ids[n_common:]
        capacity = self._batch.n_tokens_max
        while sum(len(t) for t in todo.values()) > capacity:  # long catch-ups (a new prompt) go in chunks
            self._batch.clear()
            for slot_id, tokens in todo.items():
                n = min(len(tokens) - 1, capacity - self._batch.n_tokens)
                if n > 0:
                    self._feed(slot_id, tokens[:n], 0)
                    todo[slot_id] = tokens[n:]
            self.context.decode(self._batch)
        self._batch.clear()
        for job in jobs:
            self._feed(job.slot_id, todo[job.slot_id], 1)
        return self.context.decode(self._batch)

    def _feed(self, slot_id: int, tokens: list[int], n_logits: int) -> None:
        cached = self._cached[slot_id]
        self._batch.add(slot_id, tokens, len(cached), n_logits)
        cached.extend(tokens)

    def close(self) -> None:
        self.context.close()
        self.model.close()


def _factory(model: Model, target: Model, shape: ContextShape, **_: object) -> ModelDrafter:
    check_same_vocab(target, model)
    return ModelDrafter(model, shape)


register_drafter("draft-model", _factory)
