"""Audio models through mlx-audio: speech to text, text to speech, voice activity.

The kind of a model folder is the one mlx-audio gives its config (`mlx_audio.registry`:
the config's model_type, or the fields that mark a family without one), never its name:
"stt", "tts" or "vad" are served; mlx-audio's other kinds (speech to speech, codecs,
language id, music) are refused with what they are. A model_type that mlx-lm or mlx-vlm
also ship as a text or vision model (mlx-audio's aliases `glm`, `mimo`) stays theirs unless
the config carries an audio part. The model is loaded with mlx-audio's own loader, as its
own generation loads it (its dtype, its quantization), every array evaluated on the
loading thread. Loading thread.
"""

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from loaders.loaded import LoadedModel, ModelLoadError, evaluate, materialize

log = logging.getLogger("mlx-backend.loader")

# The kinds served, and how a refusal names each.
SERVED = {"stt": "speech-to-text", "tts": "text-to-speech", "vad": "voice-activity"}
# The words that mark an audio part of a config (a text or vision type whose config has one is audio).
_AUDIO_WORDS = ("audio", "whisper", "speech", "acoustic", "mel", "sound")


def _config(path: Path) -> Optional[dict]:
    try:
        return json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None


def _text_or_vision_type(model_type: str) -> bool:
    import importlib.util

    return any(importlib.util.find_spec(f"{lib}.models.{model_type}") is not None
               for lib in ("mlx_lm", "mlx_vlm") if model_type.isidentifier())


def audio_kind(path: Path) -> Optional[str]:
    """mlx-audio's kind of the model in `path` ("stt", "tts", "vad", or another it knows), or None."""
    config = _config(path)
    if not isinstance(config, dict):
        return None
    from mlx_audio.registry import classify_model, model_type_from_config

    model_type = str(model_type_from_config(config) or "")
    kind = classify_model(model_type, "")  # no name: a folder called "whisper-..." is not a whisper
    if kind is None:
        return None
    if _text_or_vision_type(model_type) and not any(w in k.lower() for k in config for w in _AUDIO_WORDS):
        return None  # mlx-lm's or mlx-vlm's model (mlx-audio only aliases the name)
    return kind


@dataclass(frozen=True)
class AudioParts:
    """What the servicer and the engine need of a loaded audio model."""
    kind: str  # "stt", "tts" or "vad"
    family: str  # the mlx-audio package that serves it (whisper, kokoro, silero_vad, ...)
    sample_rate: int  # of what it writes (tts) or reads (stt, vad); 0 when the model does not say


def _family(model) -> str:
    module = type(model).__module__.split(".")
    return module[3] if len(module) > 3 and module[0] == "mlx_audio" else type(model).__module__


def _sample_rate(model, kind: str) -> int:
    for owner in (model, getattr(model, "config", None)):
        rate = getattr(owner, "sample_rate", None) or getattr(owner, "sampling_rate", None)
        if isinstance(rate, int) and rate > 0:
            return rate
    return 16000 if kind in ("stt", "vad") else 0


def _module_arrays(prefix: str) -> list:
    """The arrays mlx-audio's modules keep at module level (Granite's mel tables): made lazily on
    the thread that imported them, they must be computed there too."""
    import sys

    import mlx.core as mx

    return [v for name, m in list(sys.modules.items()) if name.startswith(prefix) and m is not None
            for v in vars(m).values() if isinstance(v, (mx.array, list, tuple, dict))]


def _espeak() -> None:
    """Point phonemizer (KittenTTS's G2P) at the espeak-ng that espeakng-loader bundles, as misaki
    (Kokoro's) finds it by itself, unless the environment names one: no system espeak-ng needed."""
    import os

    if os.environ.get("PHONEMIZER_ESPEAK_LIBRARY"):
        return
    try:
        import espeakng_loader
    except ImportError:
        return
    os.environ["PHONEMIZER_ESPEAK_LIBRARY"] = espeakng_loader.get_library_path()
    os.environ.setdefault("PHONEMIZER_ESPEAK_DATA_PATH", espeakng_loader.get_data_path())


def load_audio(spec, source: str, kind: str, started: float) -> LoadedModel:
    """mlx-audio's model for `source`, as its own loader makes it; ModelLoadError, with the
    library's reason, when it cannot be served here."""
    import mlx.core as mx

    if kind not in SERVED:
        raise ModelLoadError(f"{source}: mlx-audio serves it as a '{kind}' model, which this backend does not serve "
                             f"(served: {', '.join(f'{k} ({v})' for k, v in SERVED.items())})")
    if spec.adapters or spec.kv:
        raise ModelLoadError(f"{source}: LoRA adapters and KV cache types are served for text models only")
    if spec.dtype not in ("auto", "native"):
        raise ModelLoadError(f"{source}: an audio model runs at the dtype mlx-audio loads it in; "
                             f"DType {spec.dtype!r} is not applied to it (leave it empty, auto or native)")
    if kind == "stt":
        from mlx_audio.stt.utils import load_model
    elif kind == "tts":
        from mlx_audio.tts.utils import load_model

        _espeak()
    else:
        from mlx_audio.vad.utils import load_model
    try:
        model = load_model(Path(source))
    except Exception as e:  # the library's own words: a missing asset, a family it cannot build
        raise ModelLoadError(f"{source}: mlx-audio cannot load it: {type(e).__name__}: {e}") from None
    # Every array it holds, the codecs' and tables' kept as plain attributes too (Spark's), and
    # mlx-audio's module-level ones: one left lazy here fails on the engine thread ("There is no
    # Stream(cpu, N) in current thread").
    materialize(model)
    evaluate(_module_arrays("mlx_audio."))
    mx.clear_cache()
    config = _config(Path(source)) or {}
    parts = AudioParts(kind=kind, family=_family(model), sample_rate=_sample_rate(model, kind))
    loaded = LoadedModel(
        name=spec.model, source=source, model=model, tokenizer=None, config=config, context_size=0,
        dtype="native", options=spec.options, load_seconds=time.monotonic() - started, kind=SERVED[kind],
        audio=parts)
    log.info("loaded %s (mlx-audio %s, %s, %s Hz) in %.1fs", source, parts.family, SERVED[kind],
             parts.sample_rate or "?", loaded.load_seconds)
    return loaded
