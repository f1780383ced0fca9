import pytest

from runner.core.errors import OptionError
from runner.config.keep_alive import FOREVER, LONGEST_S, describe, parse_keep_alive


@pytest.mark.parametrize(("value", "seconds"), [
    ("30m", 1800), ("5m", 300), ("1h30m", 5400), ("45s", 45), ("250ms", 0.25), ("300", 300), (300, 300),
    (0, 0), ("0", 0), (-1, FOREVER), ("-1", FOREVER), ("-5m", FOREVER), (2.5, 2.5)])
def test_durations_are_read_as_ollama_writes_them(value: object, seconds: float) -> None:
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", [1e30, 3e11, "3e11", "100000000h", "1e400", float("inf"), LONGEST_S + 1, 10**400, -(10**400)])
def test_a_keep_alive_past_ollamas_longest_duration_is_forever(value: object) -> None:
    """(3e11 s, past the year 9999, made /api/ps a 500 and `runner ps` count the hours left in millions.)"""
    assert parse_keep_alive(value) == FOREVER
    assert describe(parse_keep_alive(value)) == "forever"


def test_the_longest_keep_alive_kept_as_a_duration_is_ollamas_longest() -> None:
    assert parse_keep_alive(LONGEST_S) == LONGEST_S == 9223372036.854776
    assert parse_keep_alive("2562047h") == 2562047 * 3600.0  # (Go's time.Duration ends at 2562047h47m16s)


@pytest.mark.parametrize("value", ["", "m", "5 minutes", "5m3", "1d", True, None, [], float("nan")])
def test_a_bad_duration_names_the_field(value: object) -> None:
    with pytest.raises(OptionError, match="^keep_alive must be a duration"):
        parse_keep_alive(value, "keep_alive")


def test_described_for_people() -> None:
    assert [describe(s) for s in (0, 90, 1800, FOREVER)] == ["0s", "90s", "30m", "forever"]
