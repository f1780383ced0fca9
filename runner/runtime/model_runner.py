"""The real runtime under the scheduler: a llama.cpp context whose sequences are the slots."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from runner.runtime.llama import Batch, Context, ContextShape, Model, in_scratch_thread
from runner.runtime.micro_batches import Padding, pad
from runner.runtime.micro_batches import Row as MicroRow

if TYPE_CHECKING:
    from runner.runtime.image_decoder import ImageDecoder

TRACE_BUFFER_BYTES = 1 << 16
TRACE_FLUSH_S = 0.05  # the trace reaches its file at least this often while the runner decodes
TRACE_ENV = "RUNNER_BATCH_TRACE"  # a path: record every batch's shape and KV edit (bench/parallel.py replays it)


class DecodeRow(Protocol):
    """One sequence's run of tokens in a batch; the last n_logits of them output logits."""

    @property
    def seq_id(self) -> int: ...
    @property
    def token_ids(self) -> list[int]: ...
    @property
    def first_pos(self) -> int: ...
    @property
    def n_logits(self) -> int: ...


class ModelRunner:
    def __init__(self, model: Model, shape: ContextShape, may_pad: bool = True) -> None:
        self.model = model
        if may_pad:  # a full step (n_batch tokens) may still get a junk token per slot
            shape = dataclasses.replace(shape, n_junk_max=shape.n_seq)
        self.context = Context(model, shape)
        self._batch = Batch(shape.n_batch_max)
        trace_path = os.environ.get(TRACE_ENV)
        # a JSON line per op: bench/parallel.py replays it as it grows (--interleaved: in turns of 0.2 s)
        self._trace = Path(trace_path).open("w", buffering=TRACE_BUFFER_BYTES) if trace_path else None
        self._trace_ops: list[list] = []
        self._trace_flushed_s = 0.0
        self.pads_batches = may_pad and not in_scratch_thread(lambda: batch_invariant(self.context, self._batch)
                                                              and attention_invariant(self.context, self._batch))
        if not may_pad:  # (the probe above has done it)
            in_scratch_thread(lambda: warm_up(self.context, self._batch))
        self.n_padding_tokens = 0  # junk tokens decoded to keep batches invariant
        self.images: ImageDecoder | None = None  # a vision model's projector (set by whoever loads it)
        # what an MTP or EAGLE3 drafter reads of every decode: (context, n_tokens) -> a row per batch
        # token (its hidden row, its layer inputs), kept as `tapped`, row i's tokens from tapped_starts[i]
        self.tap: Callable[[Context, int], np.ndarray] | None = None
        self.tapped = np.empty((0, 0), dtype=np.float32)
        self.tapped_starts: list[int] = []
        # M-RoPE models (Qwen2-VL's family): an image span advances positions by its n_pos, not its
        # tokens, so past it a token's KV position is its index less what the spans saved (and every
        # cell of such a span sits at its first position). Per sequence: (index where a span starts,
        # where it ends, positions saved by the spans up to its end), in order. Callers speak token
        # indices; only this class turns them into positions.
        self._saved: dict[int, list[tuple[int, int, int]]] = {}
        # a model with sliding-window layers whose KV holds only the window: its width, and per
        # sequence the window's KV saved at a prompt's end (token count, llama.cpp's state)
        self.window = model.n_swa if not shape.swa_full else 0
        self._checkpoints: dict[int, tuple[int, object]] = {}

    def decode(self, rows: Sequence[DecodeRow]) -> list[np.ndarray]:
        """Put every row into one batch, run one llama_decode; returns each row's logits rows
        (views, n_logits of them, in the order the rows were given).

        Rows go in slot order (consecutive slots share llama.cpp's micro-batches); where the
        kernels are not batch-invariant, micro-batches are padded (see micro_batches)."""
        if len(rows) == 1 and not self.pads_batches and self.tap is None and self._trace is None:
            return self._decode_one(rows[0])
        order = sorted(range(len(rows)), key=lambda i: rows[i].seq_id)
        in_slot_order = [rows[i] for i in order]
        padding = self._padding(in_slot_order) if self.pads_batches else None
        batch = self._batch
        batch.clear()
        starts, firsts, junk_rows = [], [], []
        for i, row in enumerate(in_slot_order):
            starts.append(batch.n_tokens)
            first_pos = self._pos(row.seq_id, row.first_pos)
            firsts.append(batch.add(row.seq_id, row.token_ids, first_pos, row.n_logits))
            if padding and padding.junk[i]:
                first_junk = first_pos + len(row.token_ids)
                batch.add(row.seq_id, [row.token_ids[-1]] * padding.junk[i], first_junk, 0)
                self.n_padding_tokens += padding.junk[i]
                junk_rows.append((row.seq_id, first_junk))
        if padding and any(padding.extra_logits):  # extra logits rows shift the rows after them
            for start, offsets in zip(starts, padding.extra_logits):
                for offset in offsets:
                    batch.set_logits(start + offset)
            out_rows = batch.output_rows()
            firsts = [int(out_rows[start + len(row.token_ids) - row.n_logits]) if row.n_logits else -1
                      for row, start in zip(in_slot_order, starts)]
        if self._trace:
            self._record(["decode", self._traced_rows(in_slot_order, padding)])
        logits = self.context.decode(batch)
        if self.tap is not None:
            self.tapped = self.tap(self.context, batch.n_tokens)
            self.tapped_starts = [0] * len(rows)
            for i, start in zip(order, starts):
                self.tapped_starts[i] = start
        for seq_id, first_junk in junk_rows:  # (positions, past every span of the row's sequence)
            if self._trace:
                self._record(["kv_remove", [seq_id, first_junk, -1]])
            self.context.kv_remove(seq_id, first_junk, -1)
        out: list[np.ndarray] = [logits[:0]] * len(rows)
        for i, row, first in zip(order, in_slot_order, firsts):
            if row.n_logits:
                out[i] = logits[first : first + row.n_logits]
        return out

    def _decode_one(self, row: DecodeRow) -> list[np.ndarray]:
        """decode() of a lone row with nothing padded, tapped or traced: one client's step, whose
        Python runs with its code cold after every llama_decode, so it does only what is needed."""
        batch = self._batch
        batch.clear()
        batch.add(row.seq_id, row.token_ids, self._pos(row.seq_id, row.first_pos), row.n_logits)
        return [self.context.decode(batch)]  # the batch's outputs are this row's logits rows

    def _padding(self, rows: list[DecodeRow]) -> Padding | None:
        shape = self.context.shape
        spec = [MicroRow(r.seq_id, len(r.token_ids), r.n_logits) for r in rows]
        room = [shape.n_ctx_per_seq - r.first_pos - len(r.token_ids) for r in rows]
        spare = shape.n_batch_max - sum(len(r.token_ids) for r in rows)
        padding = pad(spec, shape.n_ubatch, room, max_junk=spare)
        return None if padding.is_empty else padding

    @staticmethod
    def _traced_rows(rows: list[DecodeRow], padding: Padding | None) -> list[list]:
        """[seq, tokens (junk included), first_pos, offsets of the tokens that output logits] per row.

        Built from the rows' own lists: numpy conversions here were a visible cost per step."""
        traced = []
        for i, row in enumerate(rows):
            n = len(row.token_ids)
            tokens, offsets = row.token_ids, list(range(n - row.n_logits, n))
            if padding:
                tokens = tokens + [tokens[-1]] * padding.junk[i]
                offsets = sorted(set(offsets).union(padding.extra_logits[i]))
            traced.append([row.seq_id, tokens, row.first_pos, offsets])
        return traced

    def decode_media(self, seq_id: int, first_pos: int, item: object) -> None:
        """An image span into a sequence's KV (its own decode: embeddings cannot share a token batch)."""
        if self.images is None:
            raise RuntimeError("this model has no projector: it cannot take images")
        end = first_pos + item.n_tokens  # type: ignore[attr-defined]
        end_pos = self.images.decode(self.context, item, seq_id, self._pos(seq_id, first_pos))  # type: ignore[arg-type]
        saved = end - end_pos
        if saved:
            spans = self._saved.setdefault(seq_id, [])
            del spans[next((i for i, (_, at, _) in enumerate(spans) if at > first_pos), len(spans)):]
            spans.append((first_pos, end, saved))

    def _pos(self, seq_id: int, index: int) -> int:
        """The KV position of a sequence's token index (the index itself but past an M-RoPE span)."""
        spans = self._saved.get(seq_id)
        if not spans:
            return index
        saved = 0
        for start, end, total in spans:
            if end > index:
                return start - saved if start <= index else index - saved  # (inside a span: its first position)
            saved = total
        return index - saved

    def kv_remove(self, seq_id: int, p0: int = 0, p1: int = -1) -> bool:
        """Remove token indices [p0, p1) of a sequence (p1 < 0: to the end). Where sliding-window
        layers no longer hold what continuing at p0 needs, the checkpoint taken there is put back."""
        if self._trace:
            self._record(["kv_remove", [seq_id, p0, p1]])
        removed = self.context.kv_remove(seq_id, self._pos(seq_id, p0), self._pos(seq_id, p1) if p1 >= 0 else -1)
        if self.window:
            self._rewind_window(seq_id, p0)
        spans = self._saved.get(seq_id)
        if removed and spans and p1 < 0:  # (the spans that ended past p0 are gone)
            self._saved[seq_id] = [span for span in spans if span[1] <= p0]
        return removed

    # -- sliding-window layers (ContextShape.swa_full off: they keep their window and a micro-batch) --
    def usable_prefix(self, seq_id: int, n_keep: int, copied: bool = False) -> int:
        """How many of a sequence's first n_keep cached tokens a continuation can keep: all of them
        while its sliding-window layers still hold the cells the token after them sees; else as
        many as its checkpoint holds (a prompt's end), or none. `copied`: the continuation runs in
        another sequence, which gets a copy of this one's KV first; a checkpoint cannot serve
        there (one KV stream per sequence: llama.cpp copies a stream's data at the next decode,
        over a window restored before it)."""
        if self.window == 0 or n_keep == 0 or self._window_holds(seq_id, n_keep):
            return n_keep
        if copied:
            return 0
        checkpoint = self._checkpoints.get(seq_id)
        return checkpoint[0] if checkpoint is not None and checkpoint[0] <= n_keep else 0

    def checkpoint(self, seq_id: int, n_tokens: int) -> None:
        """Keep a copy of the window's KV as it is after a sequence's first n_tokens (a prompt's end):
        a later prompt sharing those but not what followed (an agent's next turn, whose earlier
        reply comes back re-rendered) continues from there instead of computing them all again."""
        if self.window:
            self._checkpoints[seq_id] = (n_tokens, self.context.window_state(seq_id))

    def _window_holds(self, seq_id: int, n_tokens: int) -> bool:
        """Whether the sliding-window layers hold what the token after a sequence's first n_tokens sees
        (not where they hold nothing: a restore that failed left them empty)."""
        return 0 <= self.context.kv_pos_min(seq_id) <= max(0, self._pos(seq_id, n_tokens) - self.window)

    def _rewind_window(self, seq_id: int, p0: int) -> None:
        """After a removal from token p0 on: a checkpoint past p0 is stale; one at p0 is put back where
        the window no longer holds what continuing at p0 needs."""
        checkpoint = self._checkpoints.get(seq_id)
        if checkpoint is None or checkpoint[0] < p0:
            return
        if checkpoint[0] > p0:
            del self._checkpoints[seq_id]
        elif p0 > 0 and not self._window_holds(seq_id, p0):
            self.context.restore_window_state(seq_id, checkpoint[1])
            self.context.kv_remove(seq_id, self._pos(seq_id, p0), -1)  # (cells past it, if any were saved)

    def kv_copy_all(self, src_seq: int, dst_seq: int) -> None:
        """Make dst's KV a copy of src's (one stream per slot: llama.cpp copies whole streams)."""
        if self._trace:
            self._record(["kv_copy_all", [src_seq, dst_seq]])
        self.context.kv_copy(src_seq, dst_seq, -1, -1)
        self._saved[dst_seq] = list(self._saved.get(src_seq, []))
        if src_seq in self._checkpoints:  # (a window state restores into any sequence)
            self._checkpoints[dst_seq] = self._checkpoints[src_seq]
        else:
            self._checkpoints.pop(dst_seq, None)

    def _record(self, op: list) -> None:
        """Keep one op; they reach the file (a JSON line each) at least every TRACE_FLUSH_S.

        NOTE: serialized at flush time, not per op: per-step JSON and write syscalls would be
        charged to the server in bench/parallel.py's ours/ceiling."""
        assert self._trace is not None
        self._trace_ops.append(op)
        now = time.perf_counter()
        if now - self._trace_flushed_s > TRACE_FLUSH_S:
            self._flush_trace()
            self._trace_flushed_s = now

    def _flush_trace(self) -> None:
        assert self._trace is not None
        for op in self._trace_ops:
            self._trace.write(json.dumps(op) + "\n")
        self._trace_ops.clear()
        self._trace.flush()

    def close(self) -> None:
        if self._trace:
            self._flush_trace()
            self._trace.close()
        self.context.close()  # the model is owned (and freed) by whoever loaded it


def warm_up(context: Context, batch: Batch) -> None:
    """One decode before any request: the weights are read in from disk (mmap) and llama.cpp's
    buffers set up now, not in the first request's time to first token (~0.1 s for a 135M
    model here, seconds for large ones)."""
    batch.clear()
    batch.add(0, [max(context.model.bos_id, 0)] * 2, 0, 1)
    context.decode(batch)
    context.kv_remove(0, 0, -1)


ATTENTION_PROBE_TOKENS = 300  # a prompt length where a lone last token takes another kernel path here


def attention_invariant(context: Context, batch: Batch) -> bool:
    """Does a prompt's last token get the same logits computed alone after its prefix (cached) as
    inside the prompt's chunks (cold)? Flash attention's CPU kernel gives one row other logits than
    several past 256 positions (SmolLM2 here), whatever the weights: then lone rows are padded too."""
    n = min(ATTENTION_PROBE_TOKENS, context.shape.n_ctx_per_seq - 1, context.shape.n_batch)
    n_vocab = context.model.n_vocab
    token_ids = [(i * 7919 + 1) % n_vocab for i in range(n)]
    batch.clear()
    batch.add(0, token_ids, 0, 1)
    cold = context.decode(batch)[0].copy()
    context.kv_remove(0, n - 1, -1)
    batch.clear()
    batch.add(0, token_ids[-1:], n - 1, 1)
    cached = context.decode(batch)[0].copy()
    context.kv_remove(0, 0, -1)
    return bool(np.array_equal(cold, cached))


def batch_invariant(context: Context, batch: Batch) -> bool:
    """Does a token get the same logits alone as at the head of a two-token row? (see micro_batches)

    Probed once on the empty context: F16 weights on x86 say no, the quantized types yes."""
    token = max(context.model.bos_id, 0)
    rows = []
    for n in (1, 2):
        batch.clear()
        batch.add(0, [token] * n, 0, n)
        rows.append(context.decode(batch)[0].copy())
        context.kv_remove(0, 0, -1)
    return bool(np.array_equal(rows[0], rows[1]))
