"""A sequence's events: each token's logprob goes out with its text, and a stop string's tokens,
whose text is cut, carry none (a token without text keeps its own)."""

from __future__ import annotations

import numpy as np
import pytest

from runner.sampling.params import SamplingParams
from runner.scheduler.request import FinishReason, GenerationRequest, StreamEvent
from runner.scheduler.sequence import Sequence

PIECES = {1: b"Hi", 2: b" there", 3: b"", 4: b"S", 5: b"TOP", 6: b"!"}  # 3: a control token, no text


def _logprob_ids(ids: list[int], stop: tuple[str, ...] = (), max_tokens: int = 8) -> tuple[str, list[int]]:
    events: list[StreamEvent] = []
    request = GenerationRequest("r", (1,), SamplingParams(temperature=0), max_tokens=max_tokens, stop=stop,
                                n_top_logprobs=0, ignore_eos=True)
    seq = Sequence(request, events.append, PIECES.__getitem__, frozenset({3}))
    rows = np.zeros((1, 8), dtype=np.float32)
    for token_id in ids:
        if not seq._commit(token_id, rows, 0, False, 100):
            break
    if not seq.is_finished:
        seq.finish(FinishReason.LENGTH)
    return "".join(e.text for e in events), [lp.token_id for e in events for lp in e.logprobs]


@pytest.mark.parametrize(("ids", "stop", "expected"), [
    ([1, 2, 3], (), ("Hi there", [1, 2, 3])),  # a last token without text keeps its logprob (it was lost)
    ([1, 3, 4, 5], ("STOP",), ("Hi", [1, 3])),  # the stop string's tokens carry none; the one before it does
    ([4, 5], ("STOP",), ("", [])),  # a stop string at the very start
    ([1, 4, 6], ("STOP",), ("HiS!", [1, 4, 6])),  # held text released: its logprob goes with it
])
def test_logprobs_follow_the_text(ids: list[int], stop: tuple[str, ...], expected: tuple[str, list[int]]) -> None:
    assert _logprob_ids(ids, stop) == expected
