"""Log-probability entries in the JSON shape the host parses (engine thread)."""

from typing import Any, Dict, List


def token_bytes(tokenizer, token: int) -> bytes:
    """The raw bytes of one token (a byte-level piece may be half a character)."""
    detok = getattr(tokenizer, "_detokenizer", None)
    table = getattr(detok, "tokenmap", None)
    if table is not None and token < len(table):
        from mlx_lm.tokenizer_utils import _byte_decoder

        decoder = _byte_decoder()
        piece = table[token]
        if all(ch in decoder for ch in piece):
            return bytes(decoder[ch] for ch in piece)
    return tokenizer.decode([token]).encode("utf-8")


def _item(tokenizer, token: int, logprob: float) -> Dict[str, Any]:
    raw = token_bytes(tokenizer, token)
    return {"id": token, "token": raw.decode("utf-8", "replace"), "bytes": list(raw), "logprob": logprob}


def entry(tokenizer, token: int, logprobs, top_n: int) -> Dict[str, Any]:
    """One generated token with its `top_n` most likely alternatives.

    `logprobs` is the step's normalised log-distribution (mlx array, vocab
    sized) after the logits processors: the one the token was sampled from.
    """
    import mlx.core as mx

    out = _item(tokenizer, token, logprobs[token].item())
    top: List[Dict[str, Any]] = []
    if top_n > 0:
        k = min(top_n, logprobs.shape[-1])
        idx = mx.argpartition(-logprobs, kth=k - 1)[:k]
        vals = logprobs[idx]
        pairs = sorted(zip(idx.tolist(), vals.tolist()), key=lambda p: -p[1])
        top = [_item(tokenizer, t, v) for t, v in pairs]
    out["top_logprobs"] = top
    return out
