"""A request in flight: its sampler, detokenizer, output so far, and how it ends."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from runner.detokenizer import Detokenizer
from runner.request import EventSink, FinishReason, GenerationRequest, StreamEvent, TokenLogprob, Usage
from runner.sampling import Sampler, top_logprobs


class Sequence:
    def __init__(
        self,
        request: GenerationRequest,
        sink: EventSink,
        token_bytes: Callable[[int], bytes],
        eog_ids: frozenset[int],
    ) -> None:
        self.request = request
        self.sink = sink
        self.sampler = Sampler(request.sampling, list(request.prompt_ids))
        self.detokenizer = Detokenizer(token_bytes, request.stop)
        self.eog_ids = frozenset() if request.ignore_eos else eog_ids
        self.output_ids: list[int] = []
        self.n_cached_prompt = 0  # prompt tokens reused from a slot's cache
        self.finish_reason: FinishReason | None = None
        self.is_cancel_requested = False
        self.submitted_s = time.perf_counter()
        self.first_token_s: float | None = None

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
    def usage(self) -> Usage:
        return Usage(len(self.prompt_ids), len(self.output_ids), self.n_cached_prompt)

    def take_token(self, logits_row: np.ndarray, n_ctx_left: int) -> int | None:
        """Sample from one logits row, stream the result; return the token to feed next (None: finished)."""
        token_id = self.sampler.sample(logits_row)
        logprob = None
        if self.request.n_top_logprobs is not None:
            chosen, top = top_logprobs(logits_row, token_id, self.request.n_top_logprobs)
            logprob = TokenLogprob(token_id, chosen, tuple(top))
        if self.first_token_s is None:
            self.first_token_s = time.perf_counter()
        if token_id in self.eog_ids:
            self.finish(FinishReason.STOP)
            return None
        self.sampler.accept(token_id)
        self.output_ids.append(token_id)
        text = self.detokenizer.push(token_id)
        if self.detokenizer.is_stopped:
            self.finish(FinishReason.STOP, text, (token_id,), logprob)
            return None
        if len(self.output_ids) >= self.request.max_tokens or n_ctx_left <= 0:
            self.finish(FinishReason.LENGTH, text, (token_id,), logprob)
            return None
        self.sink(StreamEvent(self.request_id, text, (token_id,), (logprob,) if logprob else ()))
        return token_id

    def finish(
        self,
        reason: FinishReason,
        text: str = "",
        token_ids: tuple[int, ...] = (),
        logprob: TokenLogprob | None = None,
        error: str | None = None,
    ) -> None:
        if self.is_finished:
            return
        self.finish_reason = reason
        text += self.detokenizer.flush()  # text held back for a stop string that never came
        self.sink(
            StreamEvent(
                self.request_id, text, token_ids, (logprob,) if logprob else (), reason, self.usage, error
            )
        )
