"""The KV cache's form at load time: made the model's own, and measured (loader thread).

A KV cache type asked for at load (adapt_options.KVSpec: quantized or float16)
is installed on the model, so that every cache later built for it takes that
form, and then measured by running the model once. The cache classes themselves
are runtime code the batch runs every step (engine/kv/kv_rows.py); loaders never
import the engine, so the engine package hands its `install` over here when imported.
"""

from typing import Callable, Optional

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from loaders.adapt_options import KVSpec

_install: Optional[Callable] = None  # engine.kv.kv_rows.install, once the engine is imported


def provide(install_forms: Callable) -> None:
    """Called by the engine package when imported: what makes a model's caches take a KVSpec's form."""
    global _install
    _install = install_forms


def install(model, spec: Optional[KVSpec]) -> None:
    """Make every cache this model builds from now on follow `spec` (engine.kv.kv_rows.install)."""
    if spec is None:
        return
    if _install is None:  # a bug, not a bad request: the engine package is imported before any load
        raise RuntimeError("no KV cache forms: the engine package was never imported")
    _install(model, spec)


def plain_cache(model) -> list:
    """A cache of the model's own float form, whatever KV cache type `install` gave it."""
    own = getattr(model, "make_cache", None)
    return own.__wrapped__() if hasattr(own, "__wrapped__") else make_prompt_cache(model)


def bytes_per_token(model, plain: bool = False) -> int:
    """Bytes the KV cache holds per token, measured by running one token through the model.

    Also proves at load time that the model runs with its cache (a group size
    that does not divide the head dimension, attention sinks with a quantized
    cache): a mismatch fails LoadModel instead of every request. With `plain`,
    the figure of the model's own float cache, for comparison.
    """
    cache = plain_cache(model) if plain else make_prompt_cache(model)
    model(mx.array([[0, 0]]), cache=cache)  # a prompt chunk
    model(mx.array([[0]]), cache=cache)  # and a decode step
    held = [c.keys_and_values() if hasattr(c, "keys_and_values") else c.state for c in cache]
    arrays = [a for _, a in tree_flatten(held) if isinstance(a, mx.array)]
    mx.eval(arrays)
    return sum(a.nbytes for a in arrays) // 3  # three tokens went in
