"""Which cache classes the prefix cache serves exactly (engine thread, or any: pure checks).

The prefix cache copies an entry (deepcopy) and, for a prompt that shares only part of a
longer entry, cuts it back with the cache's own `trim` whenever `is_trimmable()` says yes.
That is exact for mlx-lm's KV caches (a rotating window answers for its live state), and a
recurrent state (ArraysCache) says no and is served from boundary snapshots. A chunked
window (ChunkedKVCache) says yes even after it dropped its oldest chunk, so a cut across
that chunk would leave keys that are gone; and a class outside mlx-lm's cache protocol
(deepseek_v41's LayerCache: no `nbytes`, no state setter) cannot be kept at all. A model
with such a layer keeps no prefix cache: every prompt is prefilled whole.
"""

from typing import Any, Iterable, Optional

from mlx_lm.models.cache import ArraysCache, ConcatenateKVCache, KVCache, QuantizedKVCache, RotatingKVCache

from loaders.cache_kinds import layers

# Exact under cut-back as their is_trimmable() answers, or never cut back (ArraysCache).
_SERVED = (KVCache, ConcatenateKVCache, QuantizedKVCache, RotatingKVCache, ArraysCache)


def unserved(cache: Iterable[Any]) -> Optional[str]:
    """The class name of the first layer the prefix cache cannot serve exactly, or None."""
    for c in layers(cache):
        if not isinstance(c, _SERVED):
            return type(c).__name__
    return None
