from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trexo.engine.stops import StopMatcher, cut_at_stop

ALPHABET = "ab c"  # few letters: stops overlap and recur often


def reference_cut(text: str, stops: list[str]) -> tuple[str, bool]:
    """Brute force: the first end position at which some stop string is complete."""
    stops = [s for s in stops if s]
    for end in range(1, len(text) + 1):
        done = [s for s in stops if text[:end].endswith(s)]
        if done:
            return text[: end - max(map(len, done))], True
    return text, False


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


texts = st.text(alphabet=ALPHABET, max_size=30)
stop_lists = st.lists(st.text(alphabet=ALPHABET, max_size=4), max_size=3)
cut_lists = st.lists(st.integers(min_value=0, max_value=40), max_size=8)


@given(texts, stop_lists, cut_lists)
def test_streamed_output_equals_whole_text_cut(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    matcher = StopMatcher(stops)
    released = []
    stopped = False
    for piece in split(text, cuts):
        result = matcher.feed(piece)
        released.append(result.text)
        if result.stopped:
            stopped = True
            break
        # What is held back could still become a stop: a proper prefix of one, nothing more.
        assert any(s.startswith(matcher.held) and s != matcher.held for s in stops if s) or (
            matcher.held == ""
        )
    if not stopped:
        released.append(matcher.flush())
    assert ("".join(released), stopped) == reference_cut(text, stops)


@given(texts, stop_lists, cut_lists)
def test_no_release_contains_a_stop(text: str, stops: list[str], cuts: list[int]) -> None:
    matcher = StopMatcher(stops)
    out = ""
    for piece in split(text, cuts):
        result = matcher.feed(piece)
        out += result.text
        assert not any(s in out for s in stops if s)
        if result.stopped:
            break


@given(texts, stop_lists)
def test_cut_at_stop_matches_reference(text: str, stops: list[str]) -> None:
    assert cut_at_stop(text, stops) == reference_cut(text, stops)


def test_stop_split_across_pieces_is_held_then_cut() -> None:
    matcher = StopMatcher(["World"])
    assert matcher.feed("Hello, Wo").text == "Hello, "
    result = matcher.feed("rld!")
    assert result.stopped
    assert result.text == ""


def test_false_start_is_released() -> None:
    matcher = StopMatcher(["World"])
    assert matcher.feed("Hello, Wo").text == "Hello, "
    assert matcher.feed("nderful").text == "Wonderful"


def test_stop_that_ends_first_wins_over_one_that_starts_first() -> None:
    assert cut_at_stop("abcd", ["abcd", "bc"]) == ("a", True)


def test_the_stop_that_matched_is_named() -> None:
    matcher = StopMatcher(["abcd", "bc", "zz"])
    first = matcher.feed("xa")
    assert (first.text, first.matched) == ("x", None)  # "a" may begin "abcd"
    result = matcher.feed("bcd")
    assert (result.text, result.stopped, result.matched) == ("a", True, "bc")


def test_no_stops_passes_text_through() -> None:
    matcher = StopMatcher(["", ""])
    assert matcher.feed("abc").text == "abc"
    assert matcher.flush() == ""


def test_feed_after_stop_is_an_error() -> None:
    matcher = StopMatcher(["x"])
    assert matcher.feed("x").stopped
    with pytest.raises(RuntimeError):
        matcher.feed("y")
