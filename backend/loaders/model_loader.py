"""Where a model comes from and how it is loaded (on the loading thread).

A host sends `Model` (a name, a path, a `file://` URI or a hub id), `ModelFile`
(its own join of the models folder and `Model`) and `ModelPath` (the models
folder): model_source.py makes them one local path (a hub id its snapshot).
mlx-lm directories go through mlx-lm's loader; `.gguf`
files are converted once by gguf_loader and then loaded the same way;
directories of a vision family (vision_route: a vision_config, or a type only
mlx-vlm has as a vision family) go through mlx-vlm (vision_model), audio models
(speech to text, text to speech, voice activity, as mlx-audio classifies their
config) through mlx-audio (audio_model),
sequence-classification checkpoints through mlx-vlm's reranker loader
(cross_encoder).

Loading runs on its own thread while the engine keeps serving the old model;
every array of the new model is evaluated there, because MLX streams belong
to the thread that made them and the engine thread may only use finished
arrays from another thread.
"""

import logging
import os
import time
from pathlib import Path
from typing import Any, Dict, Optional

# The shared types live in `loaded` (the other loaders build them too); the servicer, the
# engine and tests still import LoadSpec, LoadedModel and the two errors from here.
from loaders import model_source
from loaders.loaded import LoadedModel, LoadSpec, ModelLoadError, ModelNotFound, materialize
from loaders.model_source import embedded_default  # noqa: F401  (the servicer and tests take it from here)

log = logging.getLogger("mlx-backend.loader")

DTYPES = ("auto", "float32", "float16", "bfloat16", "native")


def resolve(spec: LoadSpec) -> str:
    """The local path of what the host named (model_source.py: file URIs, the models folder,
    hub snapshots); ModelNotFound otherwise."""
    return model_source.resolve(spec.model, spec.model_file, spec.model_path)


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
    # On the CPU, float32 with a real BLAS beats 4-bit kernels (see docs/cpu-fast-path.md);
    # without OpenBLAS preloaded, or when it would take too much memory, keep as is.
    from common.openblas import preloaded

    if not preloaded():
        return None
    # Upper bound of the float32 size: packed 4-bit words grow 8x.
    f32_bytes = sum(v.nbytes * (8 if v.dtype == mx.uint32 else 4 // v.dtype.size)
                    for _, v in tree_flatten(model.parameters()))
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return "float32" if f32_bytes <= total // 4 else None


def _quantized(model) -> bool:
    return any("scales" in m for m in model.modules())


def _cast(model, dtype: str, evaluate: bool = True) -> None:
    import mlx.core as mx
    from mlx_lm.utils import dequantize_model

    dequantize_model(model)
    model.set_dtype(getattr(mx, dtype))
    if evaluate:  # not for a model about to be divided: each rank evaluates its part only
        mx.eval(model.parameters())


def _adapt(model, spec: LoadSpec) -> Dict[str, Any]:
    """LoRA adapters and the KV cache's form: the LoadedModel fields they set."""
    from loaders import adapters
    from loaders import kv_cache

    try:
        used = adapters.apply(model, spec.adapters, spec.model_path)
    except adapters.AdapterError as e:
        raise ModelLoadError(str(e)) from None
    kv_cache.install(model, spec.kv)
    try:
        per_token = kv_cache.bytes_per_token(model)
    except Exception as e:  # e.g. a group size that does not divide the head dimension
        kind = spec.kv.describe() if spec.kv else "float"
        raise ModelLoadError(f"the {kind} KV cache does not work with this model: {type(e).__name__}: {e}") from None
    return dict(adapters=tuple(used), adapter_scales=tuple(float(s) for _, s in spec.adapters), kv=spec.kv,
                kv_bytes_per_token=per_token,
                kv_bytes_per_token_float=kv_cache.bytes_per_token(model, plain=True) if spec.kv else per_token)


def _adapt_whole(model, spec: LoadSpec, mode: str) -> Dict[str, Any]:
    """LoRA adapters on a model about to be divided over ranks (its weights still lazy): a float
    linear's adapters fused into its weight before the split, so each rank's slice (tensor) or
    layers (pipeline) carry them; a quantized linear's added beside it (LoRAStack), which only a
    pipeline keeps whole. No probe run here: it would run the group's collectives."""
    from loaders import adapters

    if not spec.adapters:
        return {}
    if mode == "tensor" and _quantized(model):
        raise ModelLoadError("LoRA adapters on a quantized model are added beside its quantized layers, which "
                             "tensor parallelism splits itself: use parallel:pipeline (or a float model)")
    try:
        used = adapters.apply(model, spec.adapters, spec.model_path, evaluate=False)
    except adapters.AdapterError as e:
        raise ModelLoadError(str(e)) from None
    return dict(adapters=tuple(used), adapter_scales=tuple(float(s) for _, s in spec.adapters))


def describe_adaptation(lm: LoadedModel) -> str:
    return ((f", {len(lm.adapters)} LoRA adapter(s)" if lm.adapters else "")
            + (f", KV cache {lm.kv.describe()} ({lm.kv_bytes_per_token} bytes/token)" if lm.kv else ""))


def load(spec: LoadSpec, shard=None) -> LoadedModel:
    """`shard(model, config)`, when given, splits the model over ranks (lockstep);
    `shard.check(model, config)` refuses, first of all, a model that cannot be split."""
    import mlx.core as mx
    from mlx_lm import load as mlx_lm_load

    from loaders import adapters
    from loaders import cross_encoder
    from loaders import embed_loader
    from loaders import vision_route
    from loaders.gguf_convert import GGUFError
    from loaders.gguf_loader import gguf_to_mlx_dir

    if spec.dtype not in DTYPES:
        raise ModelLoadError(f"dtype {spec.dtype!r} is not one of {', '.join(DTYPES)}")
    if shard is not None and spec.kv:
        raise ModelLoadError("KV cache types are not served across ranks: a quantized cache's bytes per token "
                             "are measured at load by running the model, which across ranks would run the "
                             "group's collectives beside the served model's")
    # A causal LM embeds too: last-token pooling unless an Option says otherwise.
    embedding = embed_loader.with_options(embed_loader.EmbeddingSpec(), spec.options)
    started = time.monotonic()
    source = resolve(spec)
    for path, _ in spec.adapters:  # a wrong path fails before the model loads
        try:
            adapters.resolve(path, spec.model_path)
        except adapters.AdapterError as e:
            raise ModelLoadError(str(e)) from None
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
        from loaders import audio_model

        audio = audio_model.audio_kind(Path(source))  # as mlx-audio classifies the config
        if audio is not None:
            if shard is not None:
                raise ModelLoadError(f"{source}: only text models are served across ranks")
            return audio_model.load_audio(spec, source, audio, started)
        # By config: each library would load the other's models, wrongly.
        encoder, vision = embed_loader.is_encoder_embedding(Path(source)), vision_route.is_vision(Path(source))
        cross = cross_encoder.is_cross_encoder(Path(source))  # an encoder too: checked first
        if vision and shard is not None:
            raise ModelLoadError(f"{source}: vision models are not served across ranks: mlx-vlm has no way to "
                                 f"divide one (no shard or pipeline for its towers), and the other ranks replay "
                                 f"only the text batch")
        if (encoder or cross) and shard is not None:
            raise ModelLoadError(f"{source}: only generating models are served across ranks (embedding and "
                                 f"reranking passes are not divided)")
        if (encoder or vision or cross) and (spec.adapters or spec.kv):  # never ignored silently
            raise ModelLoadError(f"{source}: LoRA adapters and KV cache types are served for text models only")
        if cross:
            return cross_encoder.load(spec, source, started)
        if encoder:
            return embed_loader.load(spec, source, started)
        if vision:
            from loaders.vision_model import load_vision

            return load_vision(spec, source, started)
        if not (Path(source) / "config.json").exists():
            raise ModelLoadError(f"{source}: not an mlx-lm model directory (no config.json)")
    else:
        raise ModelLoadError(f"{source}: neither a model folder nor a .gguf file")
    try:
        model, tokenizer, config = mlx_lm_load(
            path, return_config=True, trust_remote_code=spec.trust_remote_code, lazy=shard is not None)
    except FileNotFoundError as e:
        raise ModelLoadError(f"{source}: {e}") from None
    except Exception as e:  # hub and format errors arrive as many types
        raise ModelLoadError(f"{source}: {type(e).__name__}: {e}") from None
    except SystemExit as e:  # a model module that exits when a package it needs is missing (olmo)
        raise ModelLoadError(f"{source}: mlx-lm's module for this model does not import here "
                             f"(it exited with {e.code!r}; its message is in the log)") from None

    dtype = _choose_dtype(spec.dtype, model)
    # Across ranks, cast and adapted as one process does, all lazily, then split before anything
    # is evaluated: a rank computes only its slice (tensor) or its layers (pipeline); a quantized
    # model cast to float is dequantized before the split (split layers cannot be).
    if shard is not None:
        shard.check(model, config)  # a model that cannot be divided is refused first
    if dtype:
        _cast(model, dtype, evaluate=shard is None)
    if shard is not None:
        extras = _adapt_whole(model, spec, shard.mode)
        shard(model, config)
    else:
        extras = _adapt(model, spec)
    materialize(model)
    ctx = spec.context_size or int(config.get("max_position_embeddings")
                                   or config.get("text_config", {}).get("max_position_embeddings") or 4096)
    mx.clear_cache()
    loaded = LoadedModel(
        name=spec.model, source=source, model=model, tokenizer=tokenizer, config=config,
        context_size=ctx, dtype=dtype or "native", options=spec.options,
        load_seconds=time.monotonic() - started, embedding=embedding,
        parallel=shard.mode if shard is not None else "", ranks=shard.group.size if shard is not None else 1,
        **extras)
    log.info("loaded %s (%s, dtype %s, context %d%s%s) in %.1fs", source, config.get("model_type"),
             loaded.dtype, ctx, describe_adaptation(loaded),
             f", {shard.mode} parallel over {shard.group.size} ranks" if shard is not None else "", loaded.load_seconds)
    return loaded
