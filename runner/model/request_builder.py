"""One way to turn a prompt and its parameters into the engine's GenerationRequests, for the
server and the Python API alike: the reply's length (the default when none is asked, never past
the slot's room), the request id, and a request's n choices with their own seeds."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence

from runner.sampling.constraints import AnyConstraint
from runner.sampling.params import SamplingParams
from runner.scheduler.request import BeamParams, GenerationRequest, MediaSpan


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def reply_length(max_tokens: int | None, default: int, room: int) -> int:
    """What was asked (None: the default), and never more than the slot has room for."""
    return min(default if max_tokens is None else max_tokens, room)


def generation_request(
    request_id: str, prompt_ids: tuple[int, ...], sampling: SamplingParams, max_tokens: int, stop: tuple[str, ...] = (),
    constraint: AnyConstraint | None = None, n_top_logprobs: int | None = None, ignore_eos: bool = False,
    prompt_logprobs: int | None = None, beam: BeamParams | None = None, media: tuple[MediaSpan, ...] = (),
) -> GenerationRequest:
    return GenerationRequest(
        request_id=request_id,
        prompt_ids=prompt_ids,
        sampling=sampling,
        max_tokens=max_tokens,
        stop=stop,
        n_top_logprobs=n_top_logprobs,
        ignore_eos=ignore_eos,
        constraint=constraint,
        prompt_logprobs=prompt_logprobs,
        beam=beam,
        speculate=beam is None,  # beams rank by the model's own logprobs, step by step
        media=media,
    )


def choice_requests(first: GenerationRequest, constraints: Sequence[AnyConstraint | None]) -> list[GenerationRequest]:
    """A request's choices: the first as asked, choice i with its own id, its own constraint state
    and seed + i (so that choice i is reproducible)."""
    out = [first]
    seed = first.sampling.seed
    for i, constraint in enumerate(constraints[1:], 1):
        sampling = first.sampling if seed is None else dataclasses.replace(first.sampling, seed=(seed + i) % 2**64)
        out.append(dataclasses.replace(first, request_id=f"{first.request_id}-{i}", sampling=sampling,
                                       constraint=constraint))
    return out


def beam_requests(first: GenerationRequest, n: int, beam: BeamParams) -> list[GenerationRequest]:
    """A beam search's n beams: one prompt, the group's requests, no speculation."""
    return [dataclasses.replace(first, request_id=f"{first.request_id}-{i}", speculate=False, beam=beam)
            for i in range(n)]
