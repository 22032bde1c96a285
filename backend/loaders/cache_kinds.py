"""The cache classes a model makes, as facts the lanes are chosen by (any thread, no model run).

mlx-lm's BatchGenerator batches requests by merging each one's per-layer caches (a class's
`merge`); a class without it (Llama 4's ChunkedKVCache, deepseek_v41's LayerCache) cannot
join a batch at all. engine/lane_choice.py reads these when it picks a model's lane.
"""

from typing import Any, Iterable, List, Optional, Tuple


def layers(cache: Iterable[Any]) -> List[Any]:
    """Every layer's cache, the parts of a CacheList each on its own."""
    from mlx_lm.models.cache import CacheList

    out = []
    for c in cache:
        out.extend(layers(c.caches) if isinstance(c, CacheList) else [c])
    return out


def of(model) -> Tuple[str, ...]:
    """The class names of the caches `model` makes for one request, each once, in layer order.
    Cheap: the per-layer cache objects hold no arrays yet."""
    from mlx_lm.models.cache import make_prompt_cache

    return tuple(dict.fromkeys(type(c).__name__ for c in layers(make_prompt_cache(model))))


def unmergeable(model) -> Optional[str]:
    """The name of the first cache class of `model` that mlx-lm's BatchGenerator cannot merge
    into a batch, or None when every layer's can be."""
    from mlx_lm.models.cache import make_prompt_cache

    for c in layers(make_prompt_cache(model)):
        if not hasattr(type(c), "merge"):
            return type(c).__name__
    return None


def recurrent(model) -> bool:
    """Whether `model` keeps a recurrent state (mlx-lm's ArraysCache: mamba's, a linear
    attention's, a short convolution's) in some layer: a state every token of a prefill runs
    through, left padding included."""
    from mlx_lm.models.cache import ArraysCache, make_prompt_cache

    return any(isinstance(c, ArraysCache) for c in layers(make_prompt_cache(model)))


def window(model) -> Optional[int]:
    """The smallest sliding window among `model`'s layers (a rotating cache's size, the
    library's own or mlx-vlm's), or None when no layer slides."""
    from mlx_lm.models.cache import make_prompt_cache

    sizes = [c.max_size for c in layers(make_prompt_cache(model))
             if "Rotating" in type(c).__name__ and isinstance(getattr(c, "max_size", None), int)]
    return min(sizes, default=None)
