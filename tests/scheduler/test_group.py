"""A request's sequences together: alone, n choices of one prompt (beam search: test_beam_search.py)."""

from __future__ import annotations

from runner.scheduler.group import ALONE, Choices


class Prompt:
    is_prompt_computed = False


def test_a_sequence_alone_is_admitted_whenever_a_slot_is_free() -> None:
    assert ALONE.can_admit(object(), 1)
    assert (ALONE.decides_together, ALONE.slot_ids) == (False, ())


def test_choices_wait_for_the_first_ones_prompt() -> None:
    first, other = Prompt(), Prompt()
    choices = Choices(first)
    assert choices.can_admit(first, 1)
    assert not choices.can_admit(other, 3)  # its slot will copy the first's prompt once it is in the KV
    first.is_prompt_computed = True
    assert choices.can_admit(other, 1)
