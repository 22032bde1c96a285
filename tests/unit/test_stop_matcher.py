"""StopMatcher / TextPipeline: streaming output equals post-hoc truncation.

The oracle is written here, not taken from the code: StopMatcher is built from two helpers
(common.mlx_utils' truncate_at_stop and longest_partial_suffix), so checking it against them
would pass whatever they got wrong. The references below look at every position by brute
force, and are themselves pinned by hand tables."""

import pytest
from hypothesis import given, settings, strategies as st

from common.mlx_utils import StopMatcher, TextPipeline

ALPHABET = st.sampled_from(list("ab<>/ é😀\n"))
TEXT = st.text(alphabet=ALPHABET, max_size=40)
STOPS = st.lists(st.text(alphabet=ALPHABET, min_size=0, max_size=5), max_size=4)


def cut_at_first_stop(text, stops):
    """(the text before the first position where any non-empty stop starts, whether one did):
    every position tried in order, every stop compared there."""
    for at in range(len(text)):
        if any(s and text[at:at + len(s)] == s for s in stops):
            return text[:at], True
    return text, False


def could_still_become_a_stop(seen, stops):
    """How many characters at the end of `seen` could be the start of a stop not yet complete:
    the longest tail of `seen` that some longer stop begins with (every tail tried)."""
    for n in range(len(seen), 0, -1):
        if any(len(s) > n and s.startswith(seen[-n:]) for s in stops):
            return n
    return 0


@pytest.mark.parametrize("text, stops, expected", [
    ("hello world", ["o"], ("hell", True)),
    ("hello world", ["world", "lo"], ("hel", True)),       # the earlier start wins, not the list order
    ("xabcde", ["cd", "abcde"], ("x", True)),              # a longer stop that starts first
    ("aaa", ["aa"], ("", True)),
    ("ab", ["abc"], ("ab", False)),                         # only a prefix of a stop: no cut
    ("abc", [], ("abc", False)),
    ("abc", [""], ("abc", False)),                          # an empty stop never matches
    ("", ["a"], ("", False)),
    ("é😀x", ["😀"], ("é", True)),
    ("a\n\nb", ["\n\n"], ("a", True)),
])
def test_cut_reference_by_hand(text, stops, expected):
    assert cut_at_first_stop(text, stops) == expected


@pytest.mark.parametrize("seen, stops, held", [
    ("Hello <", ["</s>"], 1),
    ("Hello </s", ["</s>"], 3),
    ("abc", ["abc"], 0),            # a whole stop is not held, it is cut
    ("aab", ["aabx", "bq"], 3),     # the longest candidate across stops
    ("xx", ["x"], 0),               # a one-character stop has no proper start to wait for
    ("a\n", ["\n\n"], 1),
    ("", ["a"], 0),
    ("abab", ["abac"], 2),          # "abab" is no start of it, its tail "ab" is
    ("é😀", ["😀!"], 1),
])
def test_held_reference_by_hand(seen, stops, held):
    assert could_still_become_a_stop(seen, stops) == held


def chunked(text, cuts):
    """`text` split at the given positions (any chunking, empty chunks too)."""
    points = sorted({min(c, len(text)) for c in cuts})
    pieces, prev = [], 0
    for p in points + [len(text)]:
        pieces.append(text[prev:p])
        prev = p
    return pieces


def run(stops, pieces):
    m = StopMatcher(stops)
    out = [m.feed(p) for p in pieces]
    out.append(m.finalize())
    return out, m.stopped


@settings(max_examples=600)
@given(TEXT, STOPS, st.lists(st.integers(0, 40), max_size=12))
def test_stream_equals_post_hoc_truncation(text, stops, cuts):
    out, stopped = run(stops, chunked(text, cuts))
    expected, matched = cut_at_first_stop(text, stops)
    assert "".join(out) == expected
    assert stopped == matched


@settings(max_examples=300)
@given(TEXT, STOPS, st.lists(st.integers(0, 40), max_size=12))
def test_no_chunk_ever_contains_a_stop_or_is_released_late(text, stops, cuts):
    pieces = chunked(text, cuts)
    m = StopMatcher(stops)
    sent = ""
    for i, piece in enumerate(pieces):
        sent += m.feed(piece)
        seen = "".join(pieces[: i + 1])
        for s in filter(None, stops):
            assert s not in sent
        # Whatever is held back could still become (part of) a stop string.
        if not m.stopped:
            assert len(seen) - len(sent) == could_still_become_a_stop(seen, [s for s in stops if s])


def test_examples():
    m = StopMatcher(["</s>", "\n\n"])
    assert m.feed("Hello <") == "Hello "
    assert m.feed("/") == ""
    assert m.feed("p> and\n") == "</p> and"
    assert m.feed("\nmore") == ""
    assert m.stopped and m.finalize() == ""
    m = StopMatcher(["STOP"])
    assert m.feed("abcST") == "abc"
    assert m.finalize() == "ST"


def test_earliest_match_wins_across_stops():
    # "cd" completes first, but "abcde" starts earlier: the earliest start wins.
    assert run(["cd", "abcde"], ["ab", "c", "de"]) == (["", "", "", ""], True)
    assert run(["cd", "abcdX"], ["ab", "c", "de"]) == (["", "", "ab", ""], True)
    assert run(["b", "abc"], ["a", "bc"]) == (["", "", ""], True)


class FakeDetokenizer:
    """Bytes per token like a byte-level BPE: a character may span tokens."""

    def __init__(self, table):
        self.table, self.buf, self.text, self.offset = table, b"", "", 0

    def add_token(self, t):
        self.buf += self.table[t]
        try:
            self.text += self.buf.decode("utf-8")
            self.buf = b""
        except UnicodeDecodeError:
            pass

    def finalize(self):
        self.text += self.buf.decode("utf-8", "replace")
        self.buf = b""

    @property
    def last_segment(self):
        seg, self.offset = self.text[self.offset:], len(self.text)
        return seg


@settings(max_examples=300)
@given(st.text(alphabet=ALPHABET, max_size=30), STOPS, st.integers(1, 4))
def test_pipeline_never_splits_characters(text, stops, width):
    data = text.encode()
    table = [data[i:i + width] for i in range(0, len(data), width)]
    pipe = TextPipeline(FakeDetokenizer(table), stops)
    deltas = [pipe.add_token(i) for i in range(len(table))] + [pipe.finalize()]
    out = ["".join(d.content for d in ds) for ds in deltas]
    for piece in out:
        piece.encode("utf-8")  # no lone surrogates, no split characters
        assert "\ufffd" not in piece
    expected, stopped = cut_at_first_stop(text, stops)
    assert "".join(out) == expected
    # Tokens kept for logprobs: never one with a byte before the cut dropped;
    # exactly those when no character spans tokens (a token that only finishes
    # a split character may be kept).
    cut = len(expected.encode())
    visible = sum(1 for i in range(len(table)) if i * width < cut) if stopped else len(table)
    assert pipe.kept_tokens() >= visible
    if text.isascii():
        assert pipe.kept_tokens() == visible
