"""Encoder embedding models (BERT, XLM-R, ModernBERT, Qwen3-Embedding...) through mlx-embeddings.

Routed by the model directory itself, never by trying one library and then
the other: a sentence-transformers layout (`modules.json` with a Pooling
module) or an encoder `model_type` in `config.json` is an embedding model.
How to pool and whether to normalise come from the model's own
sentence-transformers files (`1_Pooling/config.json`, a Normalize module),
which an Option may override. Loading thread only.
"""

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional

log = logging.getLogger("mlx-backend.loader")

# Encoders: no causal LM head, so mlx-lm cannot serve them at all.
ENCODER_TYPES = {"bert", "xlm-roberta", "xlm_roberta", "modernbert", "roberta"}


@dataclass
class EmbeddingSpec:
    """How a model turns hidden states into one vector (or keeps one per token)."""
    pooling: str = "last"
    normalize: bool = True


def _read_json(path: Path) -> Optional[Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _modules(path: Path) -> list:
    modules = _read_json(path / "modules.json")
    return modules if isinstance(modules, list) else []


def is_encoder_embedding(path: Path) -> bool:
    """True for a directory mlx-embeddings should load (see the module doc)."""
    if any(str(m.get("type", "")).endswith(".Pooling") for m in _modules(path) if isinstance(m, dict)):
        return True
    config = _read_json(path / "config.json") or {}
    return str(config.get("model_type", "")).lower() in ENCODER_TYPES


def sentence_transformers_spec(path: Path) -> EmbeddingSpec:
    """Pooling and normalisation as the model's sentence-transformers files say (mean otherwise)."""
    modules = [m for m in _modules(path) if isinstance(m, dict)]
    spec = EmbeddingSpec(pooling="mean", normalize=any(str(m.get("type", "")).endswith(".Normalize")
                                                     for m in modules))
    for m in modules:
        if str(m.get("type", "")).endswith(".Pooling"):
            cfg = _read_json(path / m.get("path", "") / "config.json") or {}
            if cfg.get("pooling_mode_cls_token"):
                spec.pooling = "cls"
            elif cfg.get("pooling_mode_lasttoken"):
                spec.pooling = "last"
            elif cfg.get("pooling_mode_mean_tokens"):
                spec.pooling = "mean"
    return spec


def with_options(spec: EmbeddingSpec, options) -> EmbeddingSpec:
    """The Options `embedding_pooling` and `embedding_normalize` (load_options.Settings, checked)
    override the model's own choice."""
    normalize = spec.normalize if options.embedding_normalize is None else options.embedding_normalize
    return EmbeddingSpec(pooling=options.embedding_pooling or spec.pooling, normalize=normalize)


def max_length(path: Path, config: Dict[str, Any]) -> int:
    """The longest input the model was trained on (sentence-transformers' max_seq_length first)."""
    st = _read_json(path / "sentence_bert_config.json") or {}
    return int(st.get("max_seq_length") or config.get("max_position_embeddings") or 512)


def load(spec, source: str, started: float):
    """A LoadedModel of kind "embedding" for the encoder directory `source`."""
    import mlx.core as mx
    from mlx_embeddings.utils import load_model
    from transformers import AutoTokenizer

    from loaders import fast_gelu
    from loaders.loaded import LoadedModel, ModelLoadError, materialize

    path = Path(source)
    embedding = with_options(sentence_transformers_spec(path), spec.options)
    try:
        config = json.loads((path / "config.json").read_text())
        model = load_model(path)
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=spec.trust_remote_code)
    except Exception as e:  # unsupported model type, missing weights, bad tokenizer: its own words
        raise ModelLoadError(f"{source}: not loadable as an embedding model ({type(e).__name__}: {e})") from None
    if spec.dtype not in ("auto", "native"):
        model.set_dtype(getattr(mx, spec.dtype))
    materialize(model)
    mx.clear_cache()
    # The CPU computes erf one element at a time: GELU from multiply-adds instead (fast_gelu.py).
    swapped = fast_gelu.for_encoder(model, spec.options)
    ctx = min(spec.context_size or 1 << 30, max_length(path, config))
    loaded = LoadedModel(
        name=spec.model, source=source, model=model, tokenizer=tokenizer, config=config,
        context_size=ctx, dtype=spec.dtype if spec.dtype not in ("auto", "native") else "native",
        options=spec.options, load_seconds=time.monotonic() - started, kind="embedding", embedding=embedding)
    log.info("loaded %s (embedding model %s, pooling %s%s, context %d%s) in %.1fs", source,
             config.get("model_type"), embedding.pooling, ", normalised" if embedding.normalize else "",
             ctx, f", {swapped} GELU layers on fast_gelu" if swapped else "", loaded.load_seconds)
    return loaded
