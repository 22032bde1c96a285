"""A vision-language model loaded through mlx-vlm, shaped for the engine (loading thread).

mlx-vlm loads the model and its processor; the engine decodes with mlx-lm's
BatchGenerator, as for text, driving the VLM's language model through
`DecodeModel`. Only the prefill differs (vision_batch: image features merged
into the prompt's embeddings), so every request keeps its own sampler, logits
processors, stop sequences, prompt cache and logprobs in the same batch.

Qwen-style models place text after an image at multimodal-RoPE positions that
lag the cache offset by a per-request delta; `MediaState`, one more layer of
the KV cache list, carries that delta (and the request's media-keyed prompt)
through the batch's merges, filters and extractions.
"""

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

log = logging.getLogger("mlx-backend.vision")



class MediaState:
    """Per-row metadata in the cache list: mRoPE delta and the media-keyed prompt.

    Speaks the cache protocol mlx-lm's batch uses (merge / filter / extend /
    extract / trim); it holds no keys or values.
    """

    def __init__(self, deltas: Optional[List[int]] = None, keys: Optional[List[List[int]]] = None):
        self.deltas = list(deltas or [0])
        self.keys = list(keys or [[]])

    # single-row view
    @property
    def delta(self) -> int:
        return self.deltas[0]

    @property
    def key(self) -> List[int]:
        return self.keys[0]

    def set(self, delta: int, key: List[int]) -> None:
        self.deltas, self.keys = [int(delta)], [list(key)]

    # the cache protocol
    @property
    def state(self):
        return []

    @state.setter
    def state(self, v):
        pass

    @property
    def meta_state(self):
        return ""

    @property
    def nbytes(self) -> int:
        return 0

    def size(self) -> int:
        return 0

    def empty(self) -> bool:
        return True

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        return n

    @classmethod
    def merge(cls, states: List["MediaState"]) -> "MediaState":
        return cls([d for s in states for d in s.deltas], [k for s in states for k in s.keys])

    def filter(self, keep) -> None:
        keep = keep.tolist() if hasattr(keep, "tolist") else list(keep)
        self.deltas = [self.deltas[i] for i in keep]
        self.keys = [self.keys[i] for i in keep]

    def extend(self, other: "MediaState") -> None:
        self.deltas += other.deltas
        self.keys += other.keys

    def extract(self, idx: int) -> "MediaState":
        return MediaState([self.deltas[idx]], [self.keys[idx]])

    def prepare(self, **kwargs) -> None:
        pass

    def finalize(self) -> None:
        pass


def run_layers(lm, inputs, cache, **kwargs):
    """`lm` over `cache` (the layers' caches, then the MediaState), in place.

    A language model may put a new cache object in a layer's place (Qwen 3.5 runs a one-row
    batch as a plain row and merges the result back into the list it was given): it is
    handed a list of the layers' caches and whatever it put there is written back, or the
    next step would run on the cache as it was before this one."""
    layers = cache[:-1]
    out = lm(inputs, cache=layers, **kwargs)
    cache[:-1] = layers
    return out


class DecodeModel:
    """The VLM's language model as mlx-lm's BatchGenerator calls it: tokens + cache -> logits."""

    def __init__(self, vlm):
        self.vlm = vlm
        self.lm = vlm.language_model
        self.layers = self.lm.layers
        self.mrope = hasattr(self.lm, "get_rope_index")

    def make_cache(self) -> List[Any]:
        from mlx_lm.models.cache import make_prompt_cache

        return make_prompt_cache(self.lm) + [MediaState()]

    def __call__(self, inputs, cache=None, **kwargs):
        import mlx.core as mx

        if self.mrope:
            kwargs["rope_deltas"] = mx.array(cache[-1].deltas, dtype=mx.int32)[:, None]
        out = run_layers(self.lm, inputs, cache, **kwargs)
        return getattr(out, "logits", out)

    def parameters(self):
        return self.vlm.parameters()


@dataclass
class VisionParts:
    """What preparation and the vision batch need besides the decode model."""
    vlm: Any
    processor: Any
    model_type: str
    media_token_ids: List[int]
    image_block: str  # the text that stands for one image in a raw prompt
    bounds: Any  # media_bounds.MediaBounds: what one request's media may cost
    takes_video: bool = False
    takes_audio: bool = False
    video_block: str = ""  # the text that stands for one video in a raw prompt
    audio_block: str = ""  # the text that stands for one audio clip in a raw prompt
    audio_token_id: Optional[int] = None  # the token the processor expands for each clip
    # The image token ids, for a family whose reference attends both ways inside each image in
    # its prefill (engine/lanes/image_blocks.py: Gemma 3); None for the causal rest.
    both_ways: Optional[Tuple[int, ...]] = None
    extra: Dict[str, Any] = field(default_factory=dict)  # frame sampling for videos (fps, max_frames)
    batch_obstacle: Optional[str] = None  # why the vision batch cannot give mlx-vlm's text (see batch_obstacle)
    fresh: Any = None  # fresh_state.FreshState: the modules' own state as loaded, for the solo lane
    needs_image: Optional[str] = None  # why a prompt without media cannot be answered (see text_alone_fails)

    @property
    def prompt_type(self) -> str:
        """The model type mlx-vlm's own generation formats and tokenizes prompts by: its model's
        config's, which a family wrapping another architecture rewrites (IndicOCR's is Qwen 3.5's)."""
        return getattr(self.vlm.config, "model_type", None) or self.model_type


AUDIO_TOKENS = ("audio_token_id", "audio_token_index", "sound_context_token_id")

# Families whose published reference prefills each image's tokens attending both ways (the
# library's language model whose layers engine/lanes/image_blocks.py runs with those masks).
BOTH_WAYS = {"gemma3": "mlx_vlm.models.gemma3.language"}


def _audio_input(vlm, processor, tokenizer) -> Tuple[Optional[int], str]:
    """(the audio token id, the text of one clip in a raw prompt) when this model takes audio here
    as mlx-vlm's own generation gives it (its processor takes `audio`/`audios` and names an audio
    token, and the model kept an audio tower with weights: mlx-vlm disables one a checkpoint has
    no weights for), else (None, "")."""
    import inspect

    from mlx.utils import tree_flatten

    try:
        params = inspect.signature(processor.__call__).parameters
    except (TypeError, ValueError):
        return None, ""
    if not {"audio", "audios"} & set(params):
        return None, ""
    cfg = vlm.config
    configs = [cfg] + [v for v in vars(cfg).values() if hasattr(v, "__dict__") and not isinstance(v, type)]
    token = next((t for c in configs for t in (getattr(c, n, None) for n in AUDIO_TOKENS) if isinstance(t, int)),
                 getattr(processor, "audio_token_id", None))
    if not isinstance(token, int):
        return None, ""
    holders = [vlm] + [vlm[n] for n in ("thinker", "model") if n in vlm]
    towers = [h[n] for h in holders for n in h.keys() if "audio" in n or "sound" in n]
    if not any(hasattr(t, "parameters") and tree_flatten(t.parameters()) for t in towers):
        return None, ""
    block = getattr(processor, "audio_token", None) or tokenizer.decode([token])
    return token, block


def each_array(value, make):
    """`value` with `make` applied to each array in it (anything with a shape), through the lists,
    tuples and dicts a processor's outputs nest them in; other values as they are."""
    if hasattr(value, "shape"):
        return make(value)
    if isinstance(value, (list, tuple)):
        return type(value)(each_array(v, make) for v in value)
    if isinstance(value, dict):
        return {k: each_array(v, make) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class HostBFloat16:
    """A bfloat16 array held off the engine thread: numpy has no bfloat16, so its bits, as uint16.
    DeepSeek-OCR's processors make their pixels bfloat16; the model must get them so (as float32
    they would turn its bfloat16 tower's matmuls into float32 ones)."""
    bits: np.ndarray

    @property
    def shape(self):
        return self.bits.shape


def to_host(value):
    """An array from a processor as numpy (an MLX array made on the prep thread would belong to its
    stream); a bfloat16 one as its bits (HostBFloat16)."""
    import mlx.core as mx

    if isinstance(value, mx.array) and value.dtype == mx.bfloat16:
        return HostBFloat16(np.array(value.view(mx.uint16)))
    return np.array(value)


def to_engine(value):
    """to_host's array as an MLX array again, of the processor's dtype (on the engine thread)."""
    import mlx.core as mx

    if isinstance(value, HostBFloat16):
        return mx.array(value.bits).view(mx.bfloat16)
    return mx.array(value)


def _video_options(options, bounds) -> Dict[str, Any]:
    """Frame sampling: the fps from the load options (else the processor's), never more
    frames than the bound the pixel budget counted with."""
    from common.python_utils import option_float

    out: Dict[str, Any] = {"max_frames": bounds.max_video_frames}
    if "video_fps" in options:
        out["fps"] = option_float(options, "video_fps", 2.0, minimum=0.01)
    return out


def _image_block(processor, tokenizer, config) -> str:
    """One image as prompt text: the processor's image token, in vision start/end
    markers when the vocabulary has them (Qwen-VL), as their chat templates write it; for a
    processor that names no image token, what mlx-vlm's own chat formatting writes for one."""
    token = getattr(processor, "image_token", None)
    if token is None:
        return _formatted_image_block(processor, config)
    vocab = tokenizer.get_vocab()
    if "<|vision_start|>" in vocab and "<|vision_end|>" in vocab:
        return f"<|vision_start|>{token}<|vision_end|>"
    return token


def _formatted_image_block(processor, config) -> str:
    """The text mlx-vlm's chat formatting adds to a turn for one image: Molmo 2's processor expands
    <|image|>, a name only its code holds; Molmo's and Moondream 3's write an image's tokens
    themselves, so nothing (a marker's text would reach their prompt as words). "<image>" where
    the formatting is not one insertion or fails."""
    from mlx_vlm.prompt_utils import apply_chat_template

    text = "Describe this."
    try:
        with_image, without = (apply_chat_template(processor, config, text, num_images=n) for n in (1, 0))
    except Exception:  # a template that needs more than one plain turn
        return "<image>"
    start = len(os.path.commonprefix([with_image, without]))
    end = len(os.path.commonprefix([with_image[start:][::-1], without[start:][::-1]]))
    block = with_image[start:len(with_image) - end]
    return block if with_image[:start] + with_image[len(with_image) - end:] == without else "<image>"


def _bounds(spec):
    """The LoadModel's media bounds (a dict when they came over the wire to a follower rank)."""
    from loaders import media_bounds

    if isinstance(spec.media, media_bounds.MediaBounds):
        return spec.media
    if isinstance(spec.media, dict):
        return media_bounds.MediaBounds(**spec.media)
    return media_bounds.from_load(spec.options, {})


def _tokenizer(source: Path, processor, eos):
    """mlx-lm's tokenizer for the folder, or, when transformers cannot load one from it, the processor's own
    (PLaMo 2 VL's processor reads tokenizer.jsonl with its own class, which no Auto class knows)."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from mlx_lm.utils import load_tokenizer

    try:
        return load_tokenizer(source, eos_token_ids=eos)
    except ValueError:
        own = getattr(processor, "tokenizer", None)
        if own is None:
            raise
        return TokenizerWrapper(own, eos_token_ids=eos)


def load_vision(spec, source: str, started: float):
    """LoadedModel of kind "vision" from a directory whose config.json has a vision_config."""
    import mlx.core as mx
    import numpy as np
    from mlx_vlm.utils import load as vlm_load

    from loaders.fresh_state import FreshState
    from loaders.loaded import LoadedModel, ModelLoadError, evaluate, materialize
    from loaders.vision_probe import (MEDIA_TOKENS, batch_obstacle, embedded_test_image, media_tokens,
                                      placed_token_ids, text_alone_fails, token_config, whole_model_steps)

    if spec.dtype not in ("auto", "native"):
        raise ModelLoadError(f"dtype {spec.dtype!r}: vision models are served in their stored dtype")
    bounds = _bounds(spec)
    config = json.loads((Path(source) / "config.json").read_text())
    try:
        vlm, processor = vlm_load(source, trust_remote_code=spec.trust_remote_code)
        eos = config.get("eos_token_id") or config.get("text_config", {}).get("eos_token_id")
        tokenizer = _tokenizer(Path(source), processor, [eos] if isinstance(eos, int) else eos)
    except Exception as e:  # format errors arrive as many types
        raise ModelLoadError(f"{source}: the vision model did not load through mlx-vlm: "
                             f"{type(e).__name__}: {e}") from None
    materialize(vlm)
    # The processor's own arrays too (Inkling's audio feature extractor keeps its window and mel
    # filters as lazy MLX arrays): computed here, or a preparation thread fails on them.
    evaluate(processor)
    fresh = FreshState(vlm)  # before the test image below runs the embedding step, which may set some
    cfg = token_config(vlm.config)
    media_ids = sorted({i for i in (getattr(cfg, name, None) for name in MEDIA_TOKENS) if isinstance(i, int)})
    # A config that names no media token leaves the video's to the processor too (MiniCPM-V 4.6's fills
    # each frame's span with its video_token_id, as mlx-vlm's generation runs a clip).
    video_id = getattr(cfg, "video_token_id", None) if media_ids else getattr(processor, "video_token_id", None)
    parts = VisionParts(
        vlm=vlm, processor=processor, model_type=config.get("model_type", ""), media_token_ids=media_ids,
        image_block=_image_block(processor, tokenizer, vlm.config), bounds=bounds,
        # Video through the processor's video component and the model's video token (Qwen-VL).
        takes_video=isinstance(video_id, int) and getattr(processor, "video_processor", None) is not None,
        extra=_video_options(spec.options, bounds), fresh=fresh)
    if parts.takes_video:
        parts.video_block = parts.image_block.replace(
            getattr(processor, "image_token", "<image>"), getattr(processor, "video_token", "<video>"))
    parts.audio_token_id, parts.audio_block = _audio_input(vlm, processor, tokenizer)
    parts.takes_audio = parts.audio_token_id is not None
    if BOTH_WAYS.get(parts.model_type) == type(vlm.language_model).__module__:
        parts.both_ways = tuple(i for i in (getattr(cfg, n, None) for n in ("image_token_id", "image_token_index"))
                                if isinstance(i, int))
    # First: the test image's embedding step then leaves on the model what it did before this check.
    parts.needs_image = text_alone_fails(parts, tokenizer)
    try:
        ids, features = embedded_test_image(parts)
    except ModelLoadError as e:
        raise ModelLoadError(f"{source}: {parts.model_type} images cannot be served here: {e}") from None
    parts.media_token_ids = media_tokens(parts.media_token_ids, np.array(ids).reshape(-1).tolist(),
                                         lambda: placed_token_ids(vlm, ids, features),
                                         video_id if parts.takes_video else None)
    if parts.takes_audio:  # a clip's tokens are keyed by its content in the prefix cache, as an image's
        parts.media_token_ids = sorted(set(parts.media_token_ids) | {parts.audio_token_id})
    # The lane choice sends such a family to the solo lane.
    parts.batch_obstacle = whole_model_steps(vlm) or batch_obstacle(ids, features)
    ctx = spec.context_size or int(config.get("max_position_embeddings")
                                   or config.get("text_config", {}).get("max_position_embeddings") or 4096)
    mx.clear_cache()
    loaded = LoadedModel(
        name=spec.model, source=source, model=DecodeModel(vlm), tokenizer=tokenizer, config=config,
        context_size=ctx, dtype="native", options=spec.options, load_seconds=time.monotonic() - started,
        kind="vision", vision=parts)
    log.info("loaded %s (vision, %s, context %d) in %.1fs", source, parts.model_type, ctx, loaded.load_seconds)
    return loaded
