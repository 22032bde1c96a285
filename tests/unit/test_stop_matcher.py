"""StopMatcher / TextPipeline: streaming output equals post-hoc truncation."""

from hypothesis import given, settings, strategies as st

from common.mlx_utils import StopMatcher, TextPipeline, longest_partial_suffix, truncate_at_stop

ALPHABET = st.sampled_from(list("ab<>/ é😀\n"))
TEXT = st.text(alphabet=ALPHABET, max_size=40)
STOPS = st.lists(st.text(alphabet=ALPHABET, min_size=0, max_size=5), max_size=4)


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
    expected, matched = truncate_at_stop(text, stops)
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
            assert len(seen) - len(sent) == longest_partial_suffix(seen, [s for s in stops if s])


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
    expected, stopped = truncate_at_stop(text, stops)
    assert "".join(out) == expected
    # Tokens kept for logprobs: never one with a byte before the cut dropped;
    # exactly those when no character spans tokens (a token that only finishes
    # a split character may be kept).
    cut = len(expected.encode())
    visible = sum(1 for i in range(len(table)) if i * width < cut) if stopped else len(table)
    assert pipe.kept_tokens() >= visible
    if text.isascii():
        assert pipe.kept_tokens() == visible
