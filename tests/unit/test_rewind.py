"""rewind.can_rewind against what mlx-lm's caches actually do.

The oracle: a layer of attention over each cache class. A cache fed a prefix,
then `grow` tokens in one pass, then trimmed by `n`, must answer the next
queries (one token at a time and a chunk) exactly as a cold cache fed the
shorter sequence does. `can_rewind` must say yes exactly when that holds for
windows (no exact rewind refused, no inexact one allowed), and yes only when it
holds for the other classes.
"""

import mlx.core as mx
import pytest
from hypothesis import given, settings, strategies as st
from mlx_lm.models.cache import (
    ArraysCache, CacheList, KVCache, QuantizedKVCache, RotatingKVCache, trim_prompt_cache)

from engine.kv.rewind import can_rewind, draft_room

HEADS, DIM = 2, 64  # 64: one quantization group
TABLE = mx.random.normal((400, 3, HEADS, DIM), key=mx.random.key(3))  # per token: q, k, v


def _fetch(cache, keys, values):
    out = cache.update_and_fetch(keys, values)
    if isinstance(cache, QuantizedKVCache):
        out = tuple(mx.dequantize(*x, group_size=cache.group_size, bits=cache.bits) for x in out)
    return out


def attend(cache, tokens):
    """One attention layer's output for `tokens` fed to `cache` (and the cache updated)."""
    qkv = TABLE[mx.array(tokens)].transpose(1, 2, 0, 3)[:, None]  # (3, 1, heads, n, dim)
    n = len(tokens)
    mask = cache.make_mask(n, window_size=None, return_array=True)
    keys, values = _fetch(cache, qkv[1], qkv[2])
    out = mx.fast.scaled_dot_product_attention(qkv[0], keys, values, scale=DIM ** -0.5, mask=mask)
    mx.eval(out)
    return out


def feed(cache, tokens, chunks):
    """Feed `tokens` in pieces of the given sizes (the last piece takes the rest)."""
    i = 0
    for c in chunks:
        if i >= len(tokens):
            break
        attend(cache, tokens[i:i + c])
        i += c
    while i < len(tokens):
        attend(cache, tokens[i:i + 8])
        i += 8


MAKERS = {
    "kv": KVCache,
    "rotating": lambda: RotatingKVCache(max_size=12),
    "rotating-keep": lambda: RotatingKVCache(max_size=12, keep=2),
    "quantized": lambda: QuantizedKVCache(group_size=64, bits=8),
}


def rewound_is_exact(make, prefix, chunks, grow, n):
    """Trim after growing: (trim took all n, every later answer equals a cold cache's)."""
    tokens = list(range(1, prefix + grow + 1))
    a, b = make(), make()
    feed(a, tokens[:prefix], chunks)
    attend(a, tokens[prefix:prefix + grow]) if grow else None
    took = trim_prompt_cache([a], n) if n else 0
    kept = tokens[:prefix + grow - n]
    feed(b, kept[:prefix], chunks)
    if len(kept) > prefix:
        attend(b, kept[prefix:])
    if took != n:
        return False
    later = [[300], [301], [302], [303, 304, 305]]
    return all(mx.allclose(attend(a, t), attend(b, t), atol=1e-5).item() for t in later)


@settings(max_examples=120, deadline=None)
@given(kind=st.sampled_from(sorted(MAKERS)), prefix=st.integers(1, 20),
       chunks=st.lists(st.integers(1, 7), max_size=4), k=st.integers(1, 5), extra=st.integers(0, 1))
def test_can_rewind_matches_an_exact_rewind(kind, prefix, chunks, k, extra):
    # A verification pass: grow = k + 1 (the last token and k drafts), n = k rejected
    # (extra = 0: all of them; 1: all but one accepted... n = k - extra).
    make, n = MAKERS[kind], k - extra
    cache = make()
    feed(cache, list(range(1, prefix + 1)), chunks)
    said = can_rewind([cache], n, grow=k + 1)
    exact = rewound_is_exact(make, prefix, chunks, k + 1, n)
    if kind.startswith("rotating"):
        assert said == exact, (kind, prefix, chunks, k, n)
    else:
        assert exact and said, (kind, prefix, chunks, k, n)


@pytest.mark.parametrize("prefix", [3, 10, 11, 30])
def test_rotating_after_it_wraps_cannot_rewind(prefix):
    cache = RotatingKVCache(max_size=12)
    feed(cache, list(range(1, prefix + 1)), [1] * prefix)  # token by token, as decoding does
    assert can_rewind([cache], 1) == (prefix < 12) == rewound_is_exact(
        lambda: RotatingKVCache(max_size=12), prefix, [1] * prefix, 0, 1)


def test_a_recurrent_state_never_rewinds():
    state = ArraysCache(size=2)
    state[0] = mx.zeros((1, 3, 8))
    assert not can_rewind([state], 1)
    assert trim_prompt_cache([state], 1) == 0  # the library cannot either
    assert can_rewind([state], 0)  # nothing to drop


def test_a_cache_list_rewinds_when_every_part_does():
    def make():
        return CacheList(KVCache(), RotatingKVCache(max_size=12))

    for prefix, grow in [(4, 3), (9, 3), (20, 3)]:
        both = make()
        feed(both.caches[0], list(range(1, prefix + 1)), [])
        feed(both.caches[1], list(range(1, prefix + 1)), [])
        exact = all(rewound_is_exact(lambda i=i: make().caches[i], prefix, [], grow, 2) for i in (0, 1))
        assert can_rewind([both], 2, grow=grow) == exact == (prefix + grow < 12)
    mixed = CacheList(KVCache(), ArraysCache(size=1))
    assert not can_rewind([mixed], 1)


def test_one_layer_that_cannot_stops_the_whole_model():
    kv, window = KVCache(), RotatingKVCache(max_size=12)
    for c in (kv, window):
        feed(c, list(range(1, 11)), [])
    assert can_rewind([kv, window], 1, grow=1)
    assert not can_rewind([kv, window], 2, grow=3)  # 10 + 3 >= 12: the window would wrap


def test_draft_room_is_the_most_drafts_the_window_can_take_back():
    window = RotatingKVCache(max_size=12)
    feed(window, list(range(1, 8)), [])  # 7 held: a pass of k + 1 must stay under 12
    assert draft_room([window], 10) == 3
    assert draft_room([window], 2) == 2
    assert draft_room([KVCache()], 6) == 6
    assert draft_room([ArraysCache(size=1)], 6) == 0
