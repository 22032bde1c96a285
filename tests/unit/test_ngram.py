"""Prompt lookup (ngram.NgramIndex) against a plain scan of the context written here."""

import pytest
from hypothesis import given, settings, strategies as st

from engine.speculation.ngram import NgramIndex

TOKENS = st.lists(st.integers(0, 4), max_size=60)  # a small alphabet: many repeats


def reference(tokens, k, max_n, min_n):
    """Longest n first; for it, the latest earlier occurrence of the tail; what followed it."""
    if k <= 0:
        return []
    for n in range(min(max_n, len(tokens)), min_n - 1, -1):
        tail = tokens[len(tokens) - n:]
        for start in range(len(tokens) - n - 1, -1, -1):  # the tail itself has no follower
            if tokens[start:start + n] == tail:
                return tokens[start + n:start + n + k]
    return []


@settings(max_examples=400)
@given(TOKENS, st.integers(0, 8), st.integers(1, 4), st.integers(1, 4))
def test_proposal_equals_a_scan_of_the_context(tokens, k, a, b):
    min_n, max_n = min(a, b), max(a, b)
    index = NgramIndex(tokens, max_n=max_n, min_n=min_n)
    assert index.propose(k) == reference(tokens, k, max_n, min_n)


@settings(max_examples=200)
@given(TOKENS, st.lists(st.integers(0, 60), max_size=6), st.integers(1, 6))
def test_extending_piece_by_piece_equals_indexing_at_once(tokens, cuts, k):
    index = NgramIndex(max_n=3)
    prev = 0
    for cut in sorted(min(c, len(tokens)) for c in cuts) + [len(tokens)]:
        index.extend(tokens[prev:cut])
        prev = cut
        assert index.propose(k) == reference(tokens[:cut], k, 3, 1)


def test_a_repeated_passage_is_proposed_in_full():
    passage = [10, 11, 12, 13, 14, 15, 16]
    index = NgramIndex([1, 2] + passage + [3, 4] + passage[:3], max_n=3)
    assert index.propose(4) == passage[3:7]
    assert index.propose(10) == passage[3:] + [3, 4] + passage[:3]  # then what followed it


def test_no_match_proposes_nothing_and_sizes_are_checked():
    assert NgramIndex([1, 2, 3], max_n=2, min_n=2).propose(4) == []
    with pytest.raises(ValueError):
        NgramIndex(max_n=1, min_n=2)
