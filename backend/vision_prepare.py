"""The prompt of a request to a vision model: media decoded, placed and expanded (prep thread).

Images are decoded and bounded by media.py, placed in the prompt (by mlx-vlm's
chat templating with `num_images` for Messages, at the host's markers for a raw
Prompt), then mlx-vlm's processor expands each into its image tokens and makes
the pixel arrays. The arrays leave as numpy: the engine thread makes its own
MLX arrays from them.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from common.python_utils import OptionError, messages_to_dicts
from media import MEDIA_MARKER, b64_bytes, content_hash, decode_image, keyed_tokens


@dataclass
class VisionInputs:
    """One request's media, ready for the vision batch's prefill."""
    arrays: Dict[str, np.ndarray] = field(default_factory=dict)  # pixel_values, image_grid_thw, ...
    key: List[int] = field(default_factory=list)  # the prompt with media tokens keyed by content hash
    items: int = 0


def has_media(opts) -> bool:
    return bool(opts.Images or opts.Videos or opts.Audios)


def _refuse_kinds(parts, opts) -> None:
    for name, ok in (("Videos", parts.takes_video), ("Audios", parts.takes_audio)):
        if getattr(opts, name) and not ok:
            raise OptionError(f"{name}: the loaded model ({parts.model_type}) does not take "
                              f"{'video' if name == 'Videos' else 'audio'} input here")


def _images(parts, opts) -> Tuple[list, List[int]]:
    images, hashes = [], []
    for i, item in enumerate(opts.Images):
        field_name = f"Images[{i}]"
        raw = b64_bytes(field_name, item)
        images.append(decode_image(field_name, raw, parts.max_image_pixels))
        hashes.append(content_hash(raw))
    return images, hashes


def _raw_prompt(parts, text: str, count: int) -> str:
    """Each marker becomes one image's placeholder; their count must match the items'."""
    markers = text.count(MEDIA_MARKER)
    if markers != count:
        raise OptionError(f"Prompt: {markers} media marker(s) {MEDIA_MARKER!r} for {count} item(s) in Images")
    return text.replace(MEDIA_MARKER, parts.image_block)


def _chat_prompt(lm, opts, tools, count: int, template_kwargs: Dict[str, Any]) -> str:
    from mlx_vlm.prompt_utils import apply_chat_template

    messages = messages_to_dicts(opts.Messages)
    kwargs = dict(template_kwargs)
    if tools:
        kwargs["tools"] = tools
    try:
        return apply_chat_template(lm.vision.processor, lm.config, messages, add_generation_prompt=True,
                                   num_images=count, **kwargs)
    except Exception as e:  # jinja errors: the template rejected these messages
        raise OptionError(f"Messages: the chat template failed: {type(e).__name__}: {e}") from None


def _expand(lm, text: str, images: list) -> Tuple[List[int], Dict[str, np.ndarray]]:
    from mlx_vlm.utils import prepare_inputs, should_add_special_tokens

    parts = lm.vision
    try:
        inputs = prepare_inputs(
            parts.processor, images=images or None, prompts=text,
            image_token_index=getattr(parts.vlm.config, "image_token_index", None),
            add_special_tokens=should_add_special_tokens(parts.model_type, parts.processor))
    except Exception as e:  # the processor refused these images (size, shape)
        raise OptionError(f"Images: the model's processor refused them: {type(e).__name__}: {e}") from None
    arrays = {k: np.array(v) for k, v in inputs.items()
              if v is not None and k not in ("input_ids", "attention_mask") and hasattr(v, "shape")}
    ids = np.array(inputs["input_ids"]).reshape(-1).tolist()
    return ids, arrays


def vision_prompt(lm, opts, tools, template_kwargs) -> Optional[Tuple[str, List[int], VisionInputs]]:
    """(prompt text, expanded token ids, media) of a request with media; None when it has none."""
    parts = lm.vision
    use_template = opts.Messages and (opts.UseTokenizerTemplate or not opts.Prompt)
    if not has_media(opts) and (use_template or MEDIA_MARKER not in opts.Prompt):
        return None  # text only: the text path, exactly as for a text model
    _refuse_kinds(parts, opts)
    images, hashes = _images(parts, opts)
    if use_template:
        text = _chat_prompt(lm, opts, tools, len(images), template_kwargs)
    else:
        text = _raw_prompt(parts, opts.Prompt, len(images))
    ids, arrays = _expand(lm, text, images)
    if images and not set(ids) & set(parts.media_token_ids):
        raise OptionError("Images: the prompt has no place for them (the chat template rendered no image)")
    return text, ids, VisionInputs(arrays=arrays, key=keyed_tokens(ids, parts.media_token_ids, hashes),
                                   items=len(images))
