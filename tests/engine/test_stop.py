"""StopMatcher: stop strings on a text stream, whatever the token boundaries."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.stop import StopMatcher


def run(stops: list[str], pieces: list[str]) -> tuple[str, bool]:
    """Feed pieces like the engine does: stop at a match, flush at the end otherwise."""
    m = StopMatcher(stops)
    out = []
    for piece in pieces:
        text, matched = m.feed(piece)
        out.append(text)
        if matched:
            return "".join(out), True
    return "".join(out) + m.flush(), False


def splits(text: str, cuts: list[int]) -> list[str]:
    cuts = sorted(set(c for c in cuts if 0 < c < len(text)))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


def test_no_stops_passes_everything_through():
    m = StopMatcher([])
    assert m.feed("abc") == ("abc", False)
    assert m.feed("") == ("", False)
    assert m.flush() == ""


def test_empty_stop_strings_are_ignored():
    m = StopMatcher(["", "END"])
    assert m.stops == ["END"]
    assert run(["", ""], ["abc"]) == ("abc", False)


TEXT = "Hello there, world. STOP and then more text"
STOP = "STOP"


@pytest.mark.parametrize("i", range(1, len(TEXT)))
def test_stop_split_at_every_position_two_pieces(i):
    assert run([STOP], [TEXT[:i], TEXT[i:]]) == ("Hello there, world. ", True)


def test_stop_split_char_by_char_is_never_emitted():
    m = StopMatcher([STOP])
    emitted = []
    for ch in TEXT:
        text, matched = m.feed(ch)
        emitted.append(text)
        joined = "".join(emitted)
        assert "S" not in joined[len("Hello there, world. "):]  # nothing of the stop leaks, ever
        if matched:
            break
    assert "".join(emitted) == "Hello there, world. "
    assert matched


@pytest.mark.parametrize("a", range(0, len(TEXT) + 1, 3))
@pytest.mark.parametrize("b", range(0, len(TEXT) + 1, 4))
def test_stop_three_pieces(a, b):
    assert run([STOP], splits(TEXT, [a, b])) == ("Hello there, world. ", True)


def test_partial_prefix_held_then_released_when_it_diverges():
    m = StopMatcher(["</answer>"])
    assert m.feed("result: 42 </an") == ("result: 42 ", False)  # "</an" might start the stop
    assert m.feed("d") == ("</and", False)  # "</and" diverged: all of it is released
    assert m.flush() == ""


def test_partial_prefix_released_exactly():
    m = StopMatcher(["</answer>"])
    assert m.feed("x </an") == ("x ", False)
    assert m.feed("d y") == ("</and y", False)
    assert m.feed("<") == ("", False)
    assert m.feed("/answer> tail") == ("", True)


def test_held_text_overlapping_new_prefix():
    # "aab" stop: "aa" held, then "a" makes "aaa" whose suffix "aa" may still start the stop
    m = StopMatcher(["aab"])
    assert m.feed("xaa") == ("x", False)
    assert m.feed("a") == ("a", False)
    assert m.feed("b") == ("", True)


def test_flush_returns_held_text():
    m = StopMatcher(["<|end|>"])
    assert m.feed("done <|en") == ("done ", False)
    assert m.flush() == "<|en"
    assert m.flush() == ""


def test_stop_at_the_very_start():
    assert run(["###"], ["###rest"]) == ("", True)
    assert run(["###"], ["#", "#", "#rest"]) == ("", True)


def test_stop_within_one_piece_cut_exactly():
    m = StopMatcher(["\n\n"])
    assert m.feed("para one\n\npara two") == ("para one", True)


def test_multiple_stops_earliest_wins():
    assert run(["END", "STOP"], ["a STOP b END"]) == ("a ", True)
    assert run(["END", "STOP"], ["a END b STOP"]) == ("a ", True)
    assert run(["STOP", "END"], ["a ", "EN", "D b STOP"]) == ("a ", True)


def test_multiple_stops_holds_the_longest_possible_prefix():
    m = StopMatcher(["<end>", "<e"])
    # "<" could start either stop
    assert m.feed("text <") == ("text ", False)
    assert m.feed("x") == ("<x", False)


def test_multiple_stops_partial_of_one_complete_of_other():
    m = StopMatcher(["STOP", "ST!"])
    assert m.feed("go ST") == ("go ", False)
    assert m.feed("!") == ("", True)


def test_overlapping_stops_do_not_depend_on_split():
    stops = ["abcd", "bc"]
    assert run(stops, ["x abc", "d"]) == ("x a", True)  # "bc" completes first when streamed
    assert run(stops, ["x abcd"]) == ("x a", True)


# ---- property ----------------------------------------------------------------------------------

ALPHABET = "ab<>/ \n"


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet=ALPHABET, max_size=40),
    stop=st.text(alphabet=ALPHABET, min_size=1, max_size=5),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=12),
)
def test_property_any_split_same_result(text, stop, cuts):
    emitted, matched = run([stop], splits(text, cuts))
    idx = text.find(stop)
    if idx >= 0:
        assert matched
        assert emitted == text[:idx]
    else:
        assert not matched
        assert emitted == text


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(alphabet=ALPHABET, max_size=30),
    stop=st.text(alphabet=ALPHABET, min_size=1, max_size=4),
    cuts=st.lists(st.integers(min_value=0, max_value=30), max_size=10),
)
def test_property_emitted_is_always_a_prefix_without_the_stop(text, stop, cuts):
    m = StopMatcher([stop])
    emitted = ""
    for piece in splits(text, cuts):
        out, matched = m.feed(piece)
        emitted += out
        assert text.startswith(emitted)
        assert stop not in emitted
        if matched:
            break


@pytest.mark.parametrize("i", range(1, 12))
def test_the_matched_stop_is_named(i):
    """The stop that completes first wins and is the one named (Anthropic's `stop_sequence`)."""
    m = StopMatcher(["zzz", "b c", "c d"])
    text = "a b c d e f"
    assert m.matched is None
    for piece in (text[:i], text[i:]):
        out, matched = m.feed(piece)
        if matched:
            break
    assert matched and m.matched == "b c"
    assert StopMatcher(["x"]).matched is None
