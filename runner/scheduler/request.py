"""What the engine is asked to do and what it streams back: plain Python data only."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from runner.sampling.constraints import AnyConstraint
from runner.config.options import DEFAULT_MAX_TOKENS
from runner.sampling.params import SamplingParams


class FinishReason(str, Enum):
    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass(frozen=True)
class BeamParams:
    """Beam search (vLLM's convention): the request's n choices are its beams."""

    length_penalty: float = 1.0  # hypotheses rank by sum of logprobs / length ** length_penalty
    early_stopping: bool = False  # stop once n hypotheses finished (else: once no live beam can beat them)


@dataclass(frozen=True)
class MediaSpan:
    """An image's positions in a prompt: decoded from its embeddings, not from tokens.

    prompt_ids hold `media_placeholder(key)` at each of them, so the prefix cache compares images
    by content (equal key and length: equal KV)."""

    start: int
    n_tokens: int
    key: str
    item: object  # the runtime's handle (runtime/mtmd.ImageChunk); the step loop only passes it on

    @property
    def end(self) -> int:
        return self.start + self.n_tokens


def media_placeholder(key: str) -> int:
    """The id an image's positions hold in prompt_ids: negative (no vocabulary has it), one per content."""
    return -1 - int.from_bytes(key.encode()[:16].ljust(16, b"\0"), "big") % (2**31 - 2)


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = DEFAULT_MAX_TOKENS
    stop: tuple[str, ...] = ()
    n_top_logprobs: int | None = None  # None: no logprobs; 0: only the chosen token's
    ignore_eos: bool = False
    speculate: bool = True  # False: never draft for this request, whatever the server's --spec
    constraint: AnyConstraint | None = None  # the reply must follow this grammar (fresh per request)
    # score the prompt: each prompt token's logprob (and this many alternatives) from the prefill's
    # own logits; the prompt is then computed whole, never taken from the prefix cache. None: no
    prompt_logprobs: int | None = None
    beam: BeamParams | None = None  # this request is one beam of a beam search (the group's other requests are the others)
    media: tuple[MediaSpan, ...] = ()  # the prompt's images, in order (never at its very end)

    def next_media(self, pos: int) -> MediaSpan | None:
        """The first image span that starts at or after prompt position pos."""
        return next((span for span in self.media if span.start >= pos), None)

    def media_start_before(self, pos: int) -> int:
        """pos, or the start of the image span that pos falls inside (KV is kept by whole images)."""
        return next((span.start for span in self.media if span.start < pos < span.end), pos)


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens whose KV was reused instead of computed
    draft_proposed: int = 0  # speculative decoding: drafted tokens the target verified
    draft_accepted: int = 0  # of those, how many it kept

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class StreamEvent:
    """One step's news for one request: new text (maybe empty), and on the last event the end."""

    request_id: str
    text: str
    token_ids: tuple[int, ...] = ()
    drafted: tuple[bool, ...] = ()  # per token: accepted from a draft (True) or the target's own
    logprobs: tuple[TokenLogprob, ...] = ()
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    error: str | None = None
    stop_string: str | None = None  # the stop string that ended the reply, if one did
    prompt_logprobs: tuple[TokenLogprob, ...] = ()  # prompt tokens 1.. (the first has none), once, when scored

    @property
    def is_final(self) -> bool:
        return self.finish_reason is not None


EventSink = Callable[[StreamEvent], None]
