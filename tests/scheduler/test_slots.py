"""The slot table: prefix lookup by block hashes, and where a new request goes."""

from __future__ import annotations

from runner.sampling.params import SamplingParams
from runner.scheduler.request import GenerationRequest
from runner.scheduler.sequence import Sequence
from runner.scheduler.slots import BLOCK_LEN, SlotPool, SlotState, block_hashes, common_prefix_len


def seq(prompt: list[int]) -> Sequence:
    return Sequence(GenerationRequest("r", tuple(prompt), SamplingParams(temperature=0), 4), lambda e: None,
                    lambda t: b"x", frozenset())


def test_block_hashes_chain_full_blocks_only() -> None:
    ids = list(range(2 * BLOCK_LEN + 5))
    hashes = block_hashes(ids)
    assert len(hashes) == 2
    assert block_hashes(ids, start=1, prev=hashes[0]) == hashes[1:]
    assert block_hashes(list(range(1, 2 * BLOCK_LEN + 1)))[1] != hashes[1]  # a different first block changes both


def test_common_prefix_len() -> None:
    assert common_prefix_len([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix_len([1, 2], [1, 2, 3]) == 2


def test_a_free_slot_holding_the_prefix_is_reused_and_the_last_token_is_computed_again() -> None:
    pool = SlotPool(3)
    prompt = list(range(100, 100 + BLOCK_LEN + 10))
    pool.slots[2].append(prompt)
    place = pool.place(tuple(prompt))
    assert (place.slot.id, place.n_keep, place.copy_from) == (2, len(prompt) - 1, None)


def test_a_busy_slots_prefix_is_copied_into_a_free_one() -> None:
    pool = SlotPool(3)
    prompt = list(range(100, 100 + 2 * BLOCK_LEN))
    holder = pool.slots[0]
    holder.append(prompt)
    pool.occupy(holder, seq(prompt), 0)
    place = pool.place(tuple(prompt + [1, 2, 3]))
    assert place.copy_from is holder and place.n_keep == len(prompt)
    assert place.slot.id == 1  # next to the busy slot: one graph run for both


def test_occupy_and_release_track_state_and_recency() -> None:
    pool = SlotPool(2)
    slot = pool.slots[1]
    pool.occupy(slot, seq([1, 2, 3]), 1)
    assert (slot.state, slot.n_prompt, slot.n_prompt_reused, pool.n_busy) == (SlotState.PREFILL, 3, 1, 1)
    pool.release(slot)
    assert slot.state is SlotState.IDLE and pool.n_busy == 0 and slot.last_used > pool.slots[0].last_used
