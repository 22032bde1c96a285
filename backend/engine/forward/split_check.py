"""Whether a model's output depends on how a sequence is split between passes (engine thread).

Score continues the shared prompt's KV (from the prefix cache, a chunk at a time), which
is the library's own answer only where a causal model computes each position the same
however the sequence reaches it. mlx-lm's phi3small does not: its block-sparse layers add
the causal mask as a boolean (+1 where allowed) and mask only whole 64-token blocks, so a
position sees the later tokens of its pass. There the library's log-likelihood of a
sequence is its one forward pass over it (what `model(tokens)` gives, and the same from an
empty cache); Score runs each candidate so, prompt and candidate in one pass. Found on the
first Score by running one short sequence whole and split (two passes of 12 tokens), kept
in the loaded model's memo (what its weights determine, never a setting: loaders/loaded.py Memo).
"""

import mlx.core as mx
from loaders import rounding
from loaders.kv_cache import plain_cache

KEY = "split_sensitive"
TOKENS = list(range(20, 32))  # ids every vocabulary has; only how the passes compare matters
SPLIT = 5


def split_sensitive(lm) -> bool:
    """True when the log-probabilities of TOKENS in one pass and in two (SPLIT, then the rest,
    continuing the cache) differ by more than rounding; checked once per loaded model."""
    return lm.memo.get(KEY, lambda: _differs(lm.model))


def _differs(model) -> bool:
    def logprobs(logits):
        logits = logits[0].astype(mx.float32)
        return logits - mx.logsumexp(logits, axis=-1, keepdims=True)

    # The model's own float caches: a quantized KV cache asked for at load rounds the keys of
    # earlier passes by design (it is served through the prefix cache like any other).
    whole = logprobs(model(mx.array([TOKENS]), cache=plain_cache(model)))
    cache = plain_cache(model)
    split = mx.concatenate([logprobs(model(mx.array([TOKENS[:SPLIT]]), cache=cache)),
                            logprobs(model(mx.array([TOKENS[SPLIT:]]), cache=cache))])
    # Both -inf (a token the model never gives) is no difference.
    moved = mx.where(whole == split, 0.0, mx.abs(whole - split)).max().item()
    return moved > rounding.allowed(model)
