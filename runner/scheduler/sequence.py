"""A request in flight: its sampler, detokenizer, output so far, and how it ends."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from runner.sampling.sampler import Sampler, top_logprobs
from runner.scheduler.detokenizer import Detokenizer
from runner.scheduler.group import ALONE, Group
from runner.scheduler.request import EventSink, FinishReason, GenerationRequest, StreamEvent, TokenLogprob, Usage
from runner.scheduler.verification import verify


class Sequence:
    def __init__(
        self,
        request: GenerationRequest,
        sink: EventSink,
        token_bytes: Callable[[int], bytes],
        eog_ids: frozenset[int],
        on_finish: Callable[[FinishReason], None] | None = None,  # (the engine's count of ends, by reason)
    ) -> None:
        self.request = request
        self.sink = sink
        self._on_finish = on_finish
        self.sampler = Sampler(request.sampling, list(request.prompt_ids), request.constraint)
        self.detokenizer = Detokenizer(token_bytes, request.stop)
        self.eog_ids = frozenset() if request.ignore_eos else eog_ids
        self.output_ids: list[int] = []
        self.n_cached_prompt = 0  # prompt tokens reused from a slot's cache
        self.n_draft_proposed = 0
        self.n_draft_accepted = 0
        self.finish_reason: FinishReason | None = None
        self.is_cancel_requested = False
        self.cancel_reason: str | None = None  # said to a client still there (shutdown); None: it left
        # the sequences scheduled with it: n choices of one prompt, one beam search (set by the engine)
        self.group: Group[Sequence] = ALONE
        self._is_prompt_computed = False
        self._prompt_logprobs: list[TokenLogprob] = []  # scored, not yet sent (they ride on the next event)
        # generated tokens' logprobs not yet sent, each with where its text starts and ends (it is held)
        self._unsent_logprobs: list[tuple[int, int, TokenLogprob]] = []

    @property
    def is_prompt_computed(self) -> bool:
        """The prompt is in a slot's KV (or never will be: the request ended)."""
        return self._is_prompt_computed or self.is_finished

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prompt_ids(self) -> tuple[int, ...]:
        return self.request.prompt_ids

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def n_tokens_left(self) -> int:
        return self.request.max_tokens - len(self.output_ids)

    @property
    def usage(self) -> Usage:
        return Usage(len(self.prompt_ids), len(self.output_ids), self.n_cached_prompt,
                     self.n_draft_proposed, self.n_draft_accepted)

    def score_prompt(self, first_pos: int, rows: np.ndarray) -> None:
        """Logprobs of the prompt tokens that these positions' logits predict (position p: token p + 1)."""
        n_top = self.request.prompt_logprobs or 0
        for j, row in enumerate(rows):
            token_id = self.prompt_ids[first_pos + j + 1]
            chosen, top = top_logprobs(row, token_id, n_top)
            self._prompt_logprobs.append(TokenLogprob(token_id, chosen, tuple(top)))

    def _take_logprobs(self) -> tuple[TokenLogprob, ...]:
        """The generated tokens' logprobs whose text has been given out (some of it, at least): a
        token's logprob waits with its text while that could begin a stop string, and goes with it
        when the stop string cuts it."""
        if not self._unsent_logprobs:  # (the usual case: no logprobs asked for)
            return ()
        n_released = self.detokenizer.n_released
        out = tuple(lp for start, _, lp in self._unsent_logprobs if start < n_released)
        if out:
            self._unsent_logprobs = self._unsent_logprobs[len(out):]
        return out

    def _last_logprobs(self) -> tuple[TokenLogprob, ...]:
        """At the end, every logprob still held, but those of a stop string's tokens (text at or
        past the cut; a token without text just before it stays)."""
        held, self._unsent_logprobs = self._unsent_logprobs, []
        if self.detokenizer.stop_hit is None:
            return tuple(lp for _, _, lp in held)
        cut = self.detokenizer.n_released
        return tuple(lp for start, end, lp in held if start < cut or start == end == cut)

    def _take_prompt_logprobs(self) -> tuple[TokenLogprob, ...]:
        if not self._prompt_logprobs:  # (the usual case, every token)
            return ()
        out, self._prompt_logprobs = tuple(self._prompt_logprobs), []
        return out

    def take_tokens(
        self,
        rows: np.ndarray,
        draft_ids: list[int],
        n_ctx_left: int,
    ) -> tuple[int, int, int | None]:
        """Verify drafts on the target's rows (none: plain sampling of one row) and stream the result.

        Returns how many drafts the reply took (they stay in the KV), how many tokens the target
        decided for it (those and its own, up to the one that ended the reply), and the token to
        feed next (None: the request finished)."""
        self._is_prompt_computed = True
        # (row 0 decides the token after the prompt and the output so far)
        verdict = verify(self.sampler, rows, draft_ids, len(self.prompt_ids) + len(self.output_ids))
        self.n_draft_proposed += len(draft_ids)
        # drafts past the reply's end (its end-of-generation token, a stop string, its length) were
        # verified but are not in it: they count as neither accepted nor generated
        n_taken = 0
        for i, token_id in enumerate(verdict.committed_ids):  # (never empty: the target's own token ends it)
            is_draft = i < verdict.n_accepted
            if is_draft and token_id not in self.eog_ids:  # (counted before the commit: the final
                n_taken += 1                                # event's usage is taken as it ends the reply)
                self.n_draft_accepted += 1
            if not self._commit(token_id, rows, i, is_draft, n_ctx_left - i):
                break
        return n_taken, i + 1, None if self.is_finished else verdict.committed_ids[-1]

    def _commit(self, token_id: int, rows: np.ndarray, i: int, is_draft: bool, n_ctx_left: int) -> bool:
        """Stream one decided token (decided on rows[i]); False when it ends the request."""
        logprob = None
        if self.request.n_top_logprobs is not None:
            chosen, top = top_logprobs(rows[i], token_id, self.request.n_top_logprobs)
            logprob = TokenLogprob(token_id, chosen, tuple(top))
        if token_id in self.eog_ids:
            self.finish(FinishReason.STOP)
            return False
        if not is_draft:  # verify() already recorded accepted drafts
            self.sampler.accept(token_id)
        self.output_ids.append(token_id)
        start = self.detokenizer.n_decoded
        text = self.detokenizer.push(token_id)
        if logprob is not None:
            self._unsent_logprobs.append((start, self.detokenizer.n_decoded, logprob))
        event = StreamEvent(self.request_id, text, (token_id,), (is_draft,), self._take_logprobs(),
                            prompt_logprobs=self._take_prompt_logprobs())
        if self.detokenizer.is_stopped:
            self.finish(FinishReason.STOP, event)
        elif self.n_tokens_left <= 0 or n_ctx_left <= 0:
            self.finish(FinishReason.LENGTH, event)
        else:
            self.sink(event)
        return not self.is_finished

    def finish(self, reason: FinishReason, last: StreamEvent | None = None, error: str | None = None) -> None:
        if self.is_finished:
            return
        self.finish_reason = reason
        if self._on_finish is not None:
            self._on_finish(reason)
        text = (last.text if last else "") + self.detokenizer.flush()  # text held back for a stop string
        logprobs = (last.logprobs if last else ()) + self._last_logprobs()
        self.sink(StreamEvent(
            self.request_id, text,
            last.token_ids if last else (), last.drafted if last else (), logprobs,
            reason, self.usage, error, self.detokenizer.stop_hit,
            (last.prompt_logprobs if last else ()) + self._take_prompt_logprobs(),
        ))
