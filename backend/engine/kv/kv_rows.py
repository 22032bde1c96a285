"""KV caches stored quantized or in float16 that keep continuous batching.

mlx-lm's BatchGenerator makes one cache per request (`make_prompt_cache`),
merges them into a batch cache with the class's `merge`, extends and filters
that batch as requests come and go, and extracts one row's cache when a
request leaves (which the prefix cache keeps). mlx-lm has batched float caches
only; mlx-vlm has a batched quantized cache (`BatchQuantizedKVCache`) but no
single-request cache that merges into it. The classes here close that loop,
so a request's keys and values stay in the chosen form from its first prefill
through the batch to its prefix-cache entry.

Runtime code: the batch runs these every step (engine thread). `install`, which
makes a model build its caches in the chosen form, runs once at load (loader
thread); loaders never import the engine, so the engine package hands `install`
to loaders/kv_cache.py (engine/__init__.py), which calls it and measures the result.
"""

from typing import Any, List, Optional

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache, QuantizedKVCache, make_prompt_cache
from mlx_vlm.models.cache import BatchQuantizedKVCache

from loaders.adapt_options import KVSpec


class _FloatPrefill:
    """A prompt chunk attends in float to itself; decode steps read the quantized cache.

    Everything is stored quantized either way. mlx-lm's own quantized generation
    prefills in float and quantizes afterwards, so the first token is the float
    one; quantizing the chunk before it attends to itself flips near-ties
    (SmolLM2's first answer token, measured). For a chunk of several tokens
    `update_and_fetch` returns float keys and values (the quantized past
    dequantized, the chunk as computed) and the next read of `bits` (mlx-lm's
    attention choosing its kernel by `hasattr(cache, "bits")`) reports none,
    once, so the float kernel runs. One-token decode steps are untouched.
    """

    _float_once = False

    @property
    def bits(self):
        if self._float_once:
            self._float_once = False
            raise AttributeError("bits")
        return self._bits

    @bits.setter
    def bits(self, value):
        self._bits = value

    def update_and_fetch(self, keys, values):
        self._float_once = False
        q_keys, q_values = super().update_and_fetch(keys, values)
        n = keys.shape[2]
        if n == 1:
            return q_keys, q_values
        self._float_once = True
        return self._float(q_keys, keys), self._float(q_values, values)

    def _float(self, parts, current):
        past = parts[0].shape[2] - current.shape[2]
        if past == 0:
            return current
        old = mx.dequantize(*(p[..., :past, :] for p in parts), group_size=self.group_size, bits=self._bits)
        return mx.concatenate([old.astype(current.dtype), current], axis=2)


class QuantizedRow(_FloatPrefill, QuantizedKVCache):
    """One request's quantized cache that merges into a QuantizedBatch."""

    def size(self) -> int:
        return self.offset

    @classmethod
    def merge(cls, caches: List["QuantizedRow"]) -> "QuantizedBatch":
        rows = []
        for c in caches:
            row = QuantizedBatch([0], group_size=c.group_size, bits=c._bits)
            if c.keys is not None and c.offset > 0:
                row.keys, row.values = c.keys_and_values()
                row._idx = c.offset
                row.offset = mx.array([c.offset])
            rows.append(row)
        batch = rows[0]
        for row in rows[1:]:  # extend left-pads the shorter rows
            batch.extend(row)
        return batch


class QuantizedBatch(_FloatPrefill, BatchQuantizedKVCache):
    """mlx-vlm's batched quantized cache, handing back rows that merge again."""

    def extract(self, idx: int) -> QuantizedRow:
        got = super().extract(idx)
        row = QuantizedRow(group_size=self.group_size, bits=self._bits)
        if got.keys is not None:
            row.keys, row.values, row.offset = got.keys, got.values, got.offset
        return row

    def size(self) -> int:
        return self._idx

    @property
    def nbytes(self) -> int:
        if self.keys is None:
            return 0
        return sum(a.nbytes for a in (*self.keys, *self.values))


class _Cast:
    """Stored as `dtype`; attention still sees the model's dtype."""

    dtype = mx.float16

    def update_and_fetch(self, keys, values):
        k, v = super().update_and_fetch(keys.astype(self.dtype), values.astype(self.dtype))
        return k.astype(keys.dtype), v.astype(values.dtype)


class CastRow(_Cast, KVCache):
    """One request's cache that merges into the CastBatch of its dtype."""

    def merge(self, caches):
        return batch_class(self.dtype).merge(caches)


class CastBatch(_Cast, BatchKVCache):

    @classmethod
    def merge(cls, caches):
        if all(c.size() == 0 for c in caches):  # BatchKVCache.merge would make a plain one
            return cls([0] * len(caches))
        return super().merge(caches)

    def extract(self, idx: int) -> CastRow:
        got = super().extract(idx)
        row = row_class(self.dtype)()
        row.keys, row.values, row.offset = got.keys, got.values, got.offset
        return row


_CAST_CLASSES = {}


def _cast_classes(dtype):
    if dtype not in _CAST_CLASSES:
        name = str(dtype).rsplit(".", 1)[-1].capitalize()
        _CAST_CLASSES[dtype] = (type(f"{name}Row", (CastRow,), {"dtype": dtype}),
                                type(f"{name}Batch", (CastBatch,), {"dtype": dtype}))
    return _CAST_CLASSES[dtype]


def row_class(dtype):
    """The one-request cache class that stores keys and values as `dtype`."""
    return _cast_classes(dtype)[0]


def batch_class(dtype):
    """The batch cache class that stores keys and values as `dtype`."""
    return _cast_classes(dtype)[1]


def _convert(cache: Any, spec: KVSpec) -> Any:
    # Only plain full-attention layers: rotating (sliding-window) and recurrent
    # layers keep their own caches, which the batch already knows how to merge.
    if type(cache) is not KVCache:
        return cache
    if spec.bits:
        return QuantizedRow(group_size=spec.group_size, bits=spec.bits)
    return row_class(getattr(mx, spec.dtype))()


def install(model, spec: Optional[KVSpec]) -> None:
    """Make every cache this model builds from now on follow `spec`.

    Set on the model itself (mlx-lm's make_prompt_cache asks the model first),
    so every place that builds a cache for it (the batch generator, the direct
    first-token path, any later kind of work) gets the same form.
    """
    if spec is None:
        return
    own = getattr(model, "make_cache", None)

    def make_cache():
        base = own() if own is not None else make_prompt_cache(_Plain(model))
        return [_convert(c, spec) for c in base]

    # What the model would build without `spec` (the float baseline in Status).
    make_cache.__wrapped__ = own if own is not None else (lambda: make_prompt_cache(_Plain(model)))
    model.make_cache = make_cache


class _Plain:
    """The model as make_prompt_cache sees it when the model defines no make_cache."""

    def __init__(self, model):
        self.layers = model.layers

