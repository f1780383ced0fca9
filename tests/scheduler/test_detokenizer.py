from runner.scheduler.detokenizer import Detokenizer

PIECES = {1: b"Hel", 2: b"lo", 3: b" \xc3", 4: b"\xa9t", 5: b"\xc3\xa9", 6: b"EN", 7: b"D", 8: b"\n", 9: b"Us", 10: b"er:"}


def feed(detok: Detokenizer, ids: list[int]) -> list[str]:
    return [detok.push(i) for i in ids]


def test_never_emits_half_a_utf8_character() -> None:
    d = Detokenizer(PIECES.__getitem__)
    assert feed(d, [1, 2, 3, 4]) == ["Hel", "lo", " ", "ét"]


def test_incomplete_character_at_the_end_becomes_replacement() -> None:
    d = Detokenizer(PIECES.__getitem__)
    assert feed(d, [3]) == [" "]
    assert d.flush() == "\ufffd"


def test_stop_string_across_tokens_is_cut_exactly() -> None:
    d = Detokenizer(PIECES.__getitem__, stop=["\nUser:"])
    out = feed(d, [1, 2, 8, 9, 10, 1])
    assert "".join(out) == "Hello"
    assert out == ["Hel", "lo", "", "", "", ""]
    assert d.is_stopped and d.stop_hit == "\nUser:"


def test_held_prefix_is_released_when_it_does_not_become_a_stop() -> None:
    d = Detokenizer(PIECES.__getitem__, stop=["END!"])
    assert feed(d, [6, 7]) == ["", ""]
    assert feed(d, [1]) == ["ENDHel"]
    assert d.flush() == ""


def test_earliest_stop_wins_and_text_before_it_is_kept() -> None:
    d = Detokenizer(PIECES.__getitem__, stop=["lo", "Hel"])
    assert feed(d, [1, 2]) == ["", ""]
    assert d.stop_hit == "Hel"


def test_flush_releases_held_text() -> None:
    d = Detokenizer(PIECES.__getitem__, stop=["\nUser:"])
    assert feed(d, [1, 8, 9]) == ["Hel", "", ""]
    assert d.flush() == "\nUs"
