from runner.router.eviction import Resident, make_room

MIB = 1 << 20


def resident(name: str, mib: int, *, busy: int = 0, pinned: bool = False, used: float = 0.0) -> Resident:
    return Resident(name, mib * MIB, busy, pinned, used)


def test_nothing_is_unloaded_while_there_is_room() -> None:
    room = make_room("c", 100 * MIB, 500 * MIB, [resident("a", 300)], max_models=0)
    assert room.can_load and room.evict == ()


def test_the_least_recently_used_idle_models_go_first_and_only_as_many_as_needed() -> None:
    residents = [resident("new", 100, used=30), resident("old", 100, used=10), resident("mid", 100, used=20)]
    room = make_room("c", 150 * MIB, 0, residents, max_models=0)
    assert room.evict == ("old", "mid")


def test_pinned_and_busy_models_are_never_chosen() -> None:
    residents = [resident("pinned", 100, pinned=True), resident("busy", 100, busy=2), resident("idle", 100, used=5)]
    room = make_room("c", 100 * MIB, 0, residents, max_models=0)
    assert room.evict == ("idle",)


def test_room_held_by_a_busy_model_is_a_transient_refusal_naming_it() -> None:
    room = make_room("c", 100 * MIB, 50 * MIB, [resident("busy", 100, busy=3)], max_models=0)
    assert not room.can_load and room.is_transient
    assert room.reason == ("loading 'c' needs memory or a place that models answering requests hold: "
                           "'busy' (3 in flight)")


def test_a_model_too_big_even_with_everything_unpinned_unloaded_is_refused_for_good() -> None:
    room = make_room("big", 1000 * MIB, 100 * MIB, [resident("p", 200, pinned=True), resident("idle", 300)],
                     max_models=0)
    assert not room.can_load and not room.is_transient
    assert room.reason == "'big' needs 1,000 MiB but at most 400 MiB can be freed for it (p pinned: 200 MiB)"


def test_max_models_unloads_the_least_recently_used_even_with_memory_to_spare() -> None:
    residents = [resident("a", 10, used=2), resident("b", 10, used=1)]
    assert make_room("c", MIB, 10_000 * MIB, residents, max_models=2).evict == ("b",)
    assert make_room("c", MIB, 10_000 * MIB, residents, max_models=3).evict == ()


def test_max_models_all_pinned_is_refused() -> None:
    room = make_room("c", MIB, 10_000 * MIB, [resident("a", 10, pinned=True)], max_models=1)
    assert not room.can_load and not room.is_transient
    assert room.reason == "'c' cannot load: --max-models 1 are loaded and pinned (a)"
