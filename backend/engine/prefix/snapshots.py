"""Boundary snapshots: copies of a cache that cannot be trimmed, at the points a later prompt shares.

A plain KV cache serves any shared prefix of a longer cached sequence: the prefix
cache trims it back. A rotating window that has wrapped, or a recurrent state, folds
every token in and cannot be taken back, so it serves only a prompt that extends its
whole sequence. For those, the prefill stops at a few positions P (the start of a
chat's last message, the end of the prompt, a Score's stable prefix) and keeps a
compact copy of the cache there, as the prefix cache's entry for tokens[:P]: a later
prompt sharing tokens[:P] restores it and prefills only its own rest.

A snapshot at P is, bit for bit, what mlx-lm's own classes leave after a cold
prefill of tokens[:P] through the same passes (tests/unit/test_snapshots.py; passes
matter: a rotating window keeps the tail of each multi-token pass). A warm request
then differs from a cold one of the same prompt only as any two chunkings of a
prefill do (float rounding, well within 1e-4 in logprobs: tests/e2e/test_e2e_snapshots.py).
"""

import copy
import threading
import weakref
from typing import Any, Dict, Iterable, List, Tuple

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.models.cache import CacheList, KVCache, make_prompt_cache

from engine.kv.rewind import can_rewind

# LRUPromptCache evicts its "assistant" entries (finished requests) before "user" ones
# before "system" ones (each while it holds at least as many as the next). The end of a
# prompt is a "user" entry; the start of a chat's last message and a Score's stable
# prefix, shared by the turns and calls that follow, are "system" entries.
END_OF_PROMPT = "user"
SHARED_PREFIX = "system"

# "After any prompt": more tokens than any context holds.
_ANY_LENGTH = 1 << 40


def wanted(model) -> bool:
    """Whether `model`'s cache, after a long prompt, can no longer drop its newest token
    (a rotating window past its size, a recurrent state, a cache class rewind.py does not
    know): only then are snapshots worth their copies. A plain or quantized KV cache
    answers no, and pays nothing. Cheap: the per-layer cache objects hold no arrays yet."""
    return not can_rewind(make_prompt_cache(model), 1, grow=_ANY_LENGTH)


_asked: Dict[int, Tuple[Any, bool]] = {}  # id(loaded model) -> (weak reference to it, wanted)
_asked_lock = threading.Lock()


def wanted_for(lm) -> bool:
    """`wanted` of a loaded model's model, asked once per loaded model (the preparation
    thread asks for every chat; it holds no reference that would keep the model alive)."""
    with _asked_lock:
        known = _asked.get(id(lm))
        if known is not None and known[0]() is lm:
            return known[1]
        for key in [k for k, (ref, _) in _asked.items() if ref() is None]:
            del _asked[key]
    answer = wanted(lm.model)
    with _asked_lock:
        _asked[id(lm)] = (weakref.ref(lm), answer)
    return answer


def compact(cache: List[Any]) -> List[Any]:
    """`cache` with every array of its state replaced by a copy of its own.

    A request's cache as the batch hands it out holds views into the whole batch's
    buffers: kept as they are, they would pin those buffers (far more than the bytes
    the prefix cache counts) and measurably slow the prefills that follow. A plain KV
    layer keeps its filled part only, not the room its buffer grows by.
    """
    for layer in cache:
        _compact_layer(layer)
    mx.eval([layer.state for layer in cache])
    return cache


def copied(cache: List[Any]) -> List[Any]:
    """A compact copy of a live cache, which goes on filling (the direct prefill, Score)."""
    return compact([_shallow(layer) for layer in cache])


def _shallow(layer):
    if isinstance(layer, CacheList):
        return CacheList(*(_shallow(c) for c in layer.caches))
    return copy.copy(layer)  # its arrays are replaced, not written to, by _compact_layer


def _compact_layer(layer) -> None:
    if isinstance(layer, CacheList):
        for c in layer.caches:
            _compact_layer(c)
        return
    state = layer.state
    if isinstance(layer, KVCache) and layer.keys is not None:
        state = (layer.keys[..., :layer.offset, :], layer.values[..., :layer.offset, :], layer.offset)
    # tree_map: a quantized cache's state nests (packed, scales, biases)
    layer.state = tree_map(lambda a: mx.array(a) if isinstance(a, mx.array) else a, state)


def positions(boundaries: Iterable[int], cached: int, length: int) -> List[int]:
    """The snapshot positions of a prompt of `length` tokens whose first `cached` come
    from the cache: the given boundaries and the end of the prompt (length - 1: the
    last token is fed on its own, for the first token's logits), sorted, each past
    what is cached and before the last token."""
    return sorted({p for p in (*boundaries, length - 1) if cached < p < length})


def segments(rest: List[Any], cached: int, at: List[int]) -> List[List[Any]]:
    """`rest` (the prompt from position `cached` on) cut at the absolute positions `at`."""
    out, start = [], 0
    for p in at:
        out.append(rest[start:p - cached])
        start = p - cached
    out.append(rest[start:])
    return [s for s in out if s]
