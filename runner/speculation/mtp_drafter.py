"""Drafting with the target's own multi-token-prediction (MTP) layers (GLM-4.5, DeepSeek-V3, Qwen3.5...).

A second context on the target's model runs only its MTP layers, with a KV of their own and one
sequence per slot. Position p of that KV is fed the token at p together with the target's hidden
row at p-1 (what the target computed for the token before); its logits guess the token after p,
and its own hidden row feeds the next guess. Each step, one batched decode catches every drafting
slot up to its committed tokens (the target's rows come from target_rows.TargetRows, kept after
every step) and yields the first draft; then one batched decode per further draft position. The
drafts' own positions hold MTP rows, not the target's, so they are removed before the next
catch-up. Free order: this context before the target's.
"""

from __future__ import annotations

import numpy as np

from runner.runtime import staging
from runner.runtime.llama import Batch, Context, ContextShape
from runner.runtime.model_runner import ModelRunner
from runner.scheduler.batch import BatchPlan
from runner.speculation.draft_samplers import DraftSamplers
from runner.speculation.drafter import DraftJob, register_drafter
from runner.speculation.target_rows import TargetRows


class MtpDrafter:
    name = "mtp"
    is_free = False

    def __init__(self, target: ModelRunner, shape: ContextShape) -> None:
        staging.require(staging.MTP_CALLS, "MTP drafting")
        self.target = target
        model = target.model
        target.context.capture_hidden(masked=False)  # every token's hidden row, prompt chunks included
        target.tap = lambda context, n_tokens: context.hidden(n_tokens)
        self.context = Context(model, shape, mtp_of=target.context)
        self.context.capture_hidden(masked=False)  # (all rows, by batch index: catch-up and drafts share a batch)
        self._batch = Batch(max(shape.n_batch, shape.n_seq * 2), model.n_embd_out)
        self.rows = TargetRows(model.n_embd_out, shape.n_ctx_per_seq)
        self._cached: dict[int, list[int]] = {}  # per slot: tokens in the MTP KV, each fed with the target's row
        self._samplers = DraftSamplers()
        self._chained: set[int] = set()  # slots whose MTP KV holds draft positions until after_step

    def after_step(self, plan: BatchPlan) -> None:
        """Keep the step's target rows (the speculator calls this after every step), and drop the
        drafts' positions from the MTP KV: it holds only tokens fed with the target's rows."""
        self.rows.record(plan, self.target)
        for slot_id in self._chained:
            self.context.kv_remove(slot_id, len(self._cached[slot_id]), -1)
        self._chained.clear()

    def propose(self, jobs: list[DraftJob]) -> None:
        jobs = sorted((j for j in jobs if j.k > 0 and self.rows.covers(j.slot_id, j.context_ids, len(j.context_ids) - 1)),
                      key=lambda j: j.slot_id)
        if not jobs:
            return
        logits, hidden = self._catch_up(jobs)
        positions = {j.slot_id: len(j.context_ids) for j in jobs}  # where each slot's next draft goes
        live = list(range(len(jobs)))
        for _ in range(max(j.k for j in jobs)):
            for row, i in enumerate(live):
                token, dist = self._samplers.draw(jobs[i], logits[row])
                jobs[i].draft_ids.append(token)
                jobs[i].draft_dists.append(dist)
            fed = [(i, hidden[row]) for row, i in enumerate(live) if len(jobs[i].draft_ids) < jobs[i].k]
            if not fed:
                break
            live = [i for i, _ in fed]
            self._batch.clear()
            for i, h in fed:  # this depth's drafts, each with the MTP's own row for the token before
                slot = jobs[i].slot_id
                self._batch.add(slot, [jobs[i].draft_ids[-1]], positions[slot], 1, embd=h[None, :])
                positions[slot] += 1
                self._chained.add(slot)
            logits = self.context.decode(self._batch)
            hidden = self.context.hidden(self._batch.n_tokens)

    def _n_common(self, slot_id: int, context_ids: list[int]) -> int:
        """Leading committed tokens the MTP KV already holds (the last token is always fed again)."""
        cached = self._cached.get(slot_id, [])
        limit = min(len(cached), len(context_ids) - 1)
        n_common = 0
        while n_common < limit and cached[n_common] == context_ids[n_common]:
            n_common += 1
        return n_common

    def catch_up_len(self, slot_id: int, context_ids: list[int]) -> int:
        return len(context_ids) - self._n_common(slot_id, context_ids)

    def on_copy(self, src_slot: int, dst_slot: int) -> None:
        """The target copied a slot's KV into another: the MTP KV and the rows follow."""
        self.context.kv_copy(src_slot, dst_slot, -1, -1)
        self._cached[dst_slot] = list(self._cached.get(src_slot, []))
        self.rows.copy(src_slot, dst_slot)

    def _catch_up(self, jobs: list[DraftJob]) -> tuple[np.ndarray, np.ndarray]:
        """Feed each slot what its MTP KV lacks, up to the token to draft from; the first drafts'
        logits and the MTP's hidden rows for them (a row per job)."""
        todo: dict[int, list[int]] = {}
        for job in jobs:
            cached = self._cached.setdefault(job.slot_id, [])
            n_common = self._n_common(job.slot_id, job.context_ids)
            self.context.kv_remove(job.slot_id, n_common, -1)  # (the last drafts' positions too)
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
        last_rows = []
        for job in jobs:
            self._feed(job.slot_id, todo[job.slot_id], 1)
            last_rows.append(self._batch.n_tokens - 1)
        logits = self.context.decode(self._batch)
        return logits, self.context.hidden(self._batch.n_tokens)[last_rows]

    def _feed(self, slot_id: int, tokens: list[int], n_logits: int) -> None:
        cached = self._cached[slot_id]
        first = len(cached)
        self._batch.add(slot_id, tokens, first, n_logits, embd=self.rows.get(slot_id, first - 1, first - 1 + len(tokens)))
        cached.extend(tokens)

    def gauges(self) -> dict[str, int]:
        return {"mtp_target_rows_bytes": self.rows.n_bytes}

    def close(self) -> None:
        self.target.tap = None
        self.context.close()  # (the model is the target's)


def _factory(target: ModelRunner, shape: ContextShape, **_: object) -> MtpDrafter:
    return MtpDrafter(target, shape)


register_drafter("mtp", _factory)
