"""Fill-in-the-middle: a code model's prompt for the text between a prefix and a suffix (an
editor's completion at the cursor), in the prefix-suffix-middle order code models are trained on:
[BOS] <fim_prefix> prefix <fim_suffix> suffix <fim_middle>, the reply being the middle. The
tags are the model's own tokens (llama.cpp finds them by the GGUF's keys or their spelling)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class FimTokens:
    prefix: int
    suffix: int
    middle: int


def fill_in_the_middle(tags: FimTokens, prefix_ids: Sequence[int], suffix_ids: Sequence[int],
                       bos_id: int | None = None) -> tuple[int, ...]:
    """The prompt whose reply is what goes between prefix and suffix (bos_id: the model's BOS,
    where it starts every prompt with one)."""
    head = (bos_id,) if bos_id is not None else ()
    return (*head, tags.prefix, *prefix_ids, tags.suffix, *suffix_ids, tags.middle)
