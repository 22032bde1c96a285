"""Whether a request's live KV cache can drop its newest tokens exactly.

mlx-lm's `is_trimmable()` answers for the cache as it is now, and
`trim_prompt_cache` silently trims nothing when any layer says no. A
speculative pass must know before it runs: a sliding window that fits the
context now may wrap while the drafts go in, and then the rejected drafts
can no longer be taken out (the oldest tokens they pushed out are gone).
So the question is asked of each layer of the request's own cache, with the
tokens about to go in.
"""

from typing import Iterable

from mlx_lm.models.cache import (
    CacheList, ConcatenateKVCache, KVCache, QuantizedKVCache, RotatingKVCache)


def _layer(c, n: int, grow: int) -> bool:
    if isinstance(c, CacheList):
        return all(_layer(s, n, grow) for s in c.caches)
    if isinstance(c, (KVCache, ConcatenateKVCache, QuantizedKVCache)):
        # Trimming moves the end back; every token before it is stored as it was computed.
        return n <= c.offset + grow
    if isinstance(c, RotatingKVCache):
        # Exact while no token was ever pushed out: all `offset` tokens held in order
        # (`_idx == offset`), and still fewer than the window after `grow` more
        # (trim refuses at `offset >= max_size`).
        return c._idx == c.offset and c.offset + grow < c.max_size and n <= c.offset + grow
    # A recurrent state (ArraysCache, MambaCache) folds every token in; a chunked
    # window drops whole chunks; anything unknown: no.
    return False


def can_rewind(cache: Iterable, n: int, grow: int = 0) -> bool:
    """Whether, after `grow` more tokens go in, every layer of `cache` (one
    request's list of per-layer caches) can drop the newest `n` tokens and be as
    if they had never been there."""
    if n < 0 or grow < 0:
        raise ValueError("n and grow must be >= 0")
    if n == 0:
        return True
    return all(_layer(c, n, grow) for c in cache)


def draft_room(cache, k: int) -> int:
    """The most drafts (at most `k`) a verification pass over [last token + drafts]
    can take while every rejected one stays removable."""
    while k > 0 and not can_rewind(cache, k, grow=k + 1):
        k -= 1
    return k
