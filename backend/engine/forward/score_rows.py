"""A score job's passes (forward.py runs them a chunk at a time): the shared prompt's KV from
the prefix cache, candidate rows evaluated in batches sized by what they allocate, each row
continuing a copy of the prompt's KV in the cache's own form, and the prompt kept for the
next call. Engine thread only.
"""

import logging
from typing import List

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.models.cache import KVCache, make_prompt_cache

from engine.prefix import snapshots

log = logging.getLogger("mlx-backend.forward")

# What one pass of Score rows may allocate (rows x positions x vocabulary, and the rows' copies of
# the shared prompt's KV); a larger call takes more passes.
SCORE_CHUNK_BYTES = 256 << 20


def warm_cache(lm, cache_store, shared: List[int]):
    """A KV cache holding a prefix of `shared` (the longest the prefix cache has) and its length."""
    cache, rest = (None, shared)
    if cache_store is not None and shared:
        cache, rest = cache_store.fetch_nearest_cache(lm.epoch, shared)
    if cache is None:
        return make_prompt_cache(lm.model), 0
    cache_store.count_hit(len(shared) - len(rest))
    return cache, len(shared) - len(rest)


def _vocab(lm) -> int:
    return int(lm.config.get("vocab_size") or lm.config.get("text_config", {}).get("vocab_size")
               or len(lm.tokenizer))


def rows_end(lm, job, start: int, budget: int) -> int:
    """The end of the rows from `start` that one pass evaluates: rows x width within the token
    budget, and what the pass allocates within SCORE_CHUNK_BYTES: each row's copy of the shared
    prompt's KV, the logits of every position run (float32) and of the scored ones in float64
    (with logsumexp's temporary). One row at least."""
    vocab, kv = _vocab(lm), getattr(lm, "kv_bytes_per_token", 0)
    end, width, scored = start, 0, 0
    while end < len(job.rows):
        w = max(width, len(job.rows[end]))
        s = scored + len(job.targets[end]) - job.first[end]
        n = end - start + 1
        cost = n * len(job.shared) * kv + n * w * vocab * 4 + s * vocab * 8 * 2
        if end > start and (n * w > budget or cost > SCORE_CHUNK_BYTES):
            break
        width, scored, end = w, s, end + 1
    return end


def _repeated(cache, rows: int) -> list:
    """The shared prompt's cache repeated for `rows` rows, each layer in its own form (plain,
    quantized, cast, rotating window, recurrent state): its state with every array repeated
    along the batch axis, rebuilt by the class (mlx-lm's `from_state`)."""
    out = []
    for c in cache:
        state = c.state
        if isinstance(c, KVCache) and c.keys is not None:  # its filled part, not the spare room
            state = (c.keys[..., :c.offset, :], c.values[..., :c.offset, :], c.offset)
        out.append(type(c).from_state(tree_map(
            lambda a: mx.repeat(a, rows, axis=0) if isinstance(a, mx.array) else a, state)))
    return out


def score_rows(lm, cache, job, start: int, end: int, copies: bool = True):
    """(candidate token ids, their log-probs) of rows [start, end), evaluated as one batch.

    Logits leave the model for the rows' own positions only (the shared prompt is in the
    cache), and only the scored ones of those go on to float64. Without `copies` the one
    row continues `cache` itself.
    """
    rows = job.rows[start:end]
    width = max(len(r) for r in rows)
    ids = mx.array([r + [0] * (width - len(r)) for r in rows])
    logits = lm.model(ids, cache=_repeated(cache, len(rows)) if copies else cache)
    at, picks = [], []
    for i, targets in enumerate(job.targets[start:end]):
        first = job.first[start + i]
        at += [i * width + j for j in range(first, len(targets))]
        picks += targets[first:]
    scored = logits.reshape(-1, logits.shape[-1])[mx.array(at)]
    # float64 (CPU only in MLX): a float32 sum over a 50k-token vocabulary drifts by ~1e-4.
    with mx.stream(mx.cpu):
        wide = scored.astype(mx.float64)
        picked = mx.take_along_axis(wide, mx.array(picks)[:, None], axis=-1)[:, 0] - mx.logsumexp(wide, axis=-1)
        mx.eval(picked)
    picked, k = picked.tolist(), 0
    for i, targets in enumerate(job.targets[start:end]):
        first = job.first[start + i]
        yield targets[first:], picked[k:k + len(targets) - first]
        k += len(targets) - first


def save(cache_store, lm, job, cache, snapshot=None) -> None:
    """Keep the shared prompt's KV (up to the stable prefix) for the next call: a plain KV
    cache cut back to it, or the snapshot taken there of one that cannot be cut back."""
    if cache_store is None or job.save_upto <= 0:
        return
    if snapshot is not None:
        try:
            cache_store.insert_cache(lm.epoch, list(job.shared[:job.save_upto]), snapshot,
                                     cache_type=snapshots.SHARED_PREFIX)
        except Exception:  # as below
            log.exception("keeping a score prompt's snapshot in the prefix cache failed")
        return
    if not all(type(c) is KVCache for c in cache):
        return
    try:
        keep = []
        for c in cache:
            b = KVCache()
            n = job.save_upto
            # Compact copies: views would pin the whole buffer (see text_batch.save).
            b.state = (mx.array(c.keys[..., :n, :]), mx.array(c.values[..., :n, :]), n)
            keep.append(b)
        mx.eval([b.state for b in keep])
        cache_store.insert_cache(lm.epoch, list(job.shared[:job.save_upto]), keep)
    except Exception:  # the scores are complete: losing the cache entry must not fail them
        log.exception("keeping a score prompt in the prefix cache failed")
