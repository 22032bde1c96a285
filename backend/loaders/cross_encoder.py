"""Cross-encoder rerankers (BERT / XLM-R / ModernBERT sequence classification) through mlx-vlm.

A cross-encoder reads a (query, document) pair as one input and its one-label
classification head gives a relevance logit. Routed by the directory itself:
`architectures` in config.json naming a `...ForSequenceClassification` class.
An encoder's config would otherwise route it to mlx-embeddings, which has no
classification head, so this test comes first. Loading thread only.
"""

import json
import logging
import time
from pathlib import Path
from typing import Any, Dict

log = logging.getLogger("mlx-backend.loader")

# Sentencepiece / WordPiece tokenizers report a huge model_max_length when they know none.
_NO_LIMIT = 1_000_000


def _config(path: Path) -> Dict[str, Any]:
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return config if isinstance(config, dict) else {}


def is_cross_encoder(path: Path) -> bool:
    """True for a sequence-classification checkpoint (see the module doc)."""
    return any(str(a).endswith("ForSequenceClassification") for a in _config(path).get("architectures") or [])


def max_length(config: Dict[str, Any], tokenizer) -> int:
    """The longest pair the model reads: what both its positions and its tokenizer allow."""
    limits = [int(config.get("max_position_embeddings") or 512)]
    if config.get("model_type", "").replace("-", "_") == "xlm_roberta":
        limits[0] -= 2  # RoBERTa positions start after the padding id
    n = getattr(tokenizer, "model_max_length", None)
    if isinstance(n, int) and 0 < n < _NO_LIMIT:
        limits.append(n)
    return min(limits)


def load(spec, source: str, started: float):
    """A LoadedModel of kind "reranker" for the cross-encoder directory `source`."""
    import mlx.core as mx
    from mlx_vlm.reranker import RerankerKind, reranker_kind
    from mlx_vlm.reranker_loader import load_reranker

    from loaders import fast_gelu
    from loaders.loaded import LoadedModel, ModelLoadError, materialize

    path = Path(source)
    config = _config(path)
    try:
        supported = reranker_kind(config) == RerankerKind.SEQUENCE_CLASSIFIER
    except ValueError:
        supported = False
    if not supported:  # mlx-vlm would load it as a generative model: not what the checkpoint is
        raise ModelLoadError(f"{source}: a {config.get('model_type')!r} sequence classifier is not served "
                             "(cross-encoders: bert, xlm-roberta, modernbert)")
    try:
        # Checks for exactly one label: its logit is the relevance.
        model, processor = load_reranker(path, trust_remote_code=spec.trust_remote_code)
    except Exception as e:  # wrong label count, missing weights, bad tokenizer: its own words
        raise ModelLoadError(f"{source}: not loadable as a cross-encoder ({type(e).__name__}: {e})") from None
    tokenizer = getattr(processor, "tokenizer", processor)
    if spec.dtype not in ("auto", "native"):
        model.set_dtype(getattr(mx, spec.dtype))
    materialize(model)
    mx.clear_cache()
    swapped = fast_gelu.for_encoder(model, spec.options)  # the CPU's erf is scalar (fast_gelu.py)
    ctx = min(spec.context_size or _NO_LIMIT, max_length(config, tokenizer))
    loaded = LoadedModel(
        name=spec.model, source=source, model=model, tokenizer=tokenizer, config=config,
        context_size=ctx, dtype=spec.dtype if spec.dtype not in ("auto", "native") else "native",
        options=spec.options, load_seconds=time.monotonic() - started, kind="reranker")
    log.info("loaded %s (cross-encoder %s, context %d%s) in %.1fs", source, config.get("model_type"), ctx,
             f", {swapped} GELU layers on fast_gelu" if swapped else "", loaded.load_seconds)
    return loaded
