"""The prompt of a request to a vision model: media decoded, placed and expanded (prep thread).

Nothing is decoded before the request's media fit their bounds (media_bounds:
counts, payload bytes, then pixels from the images' and videos' headers);
images are then decoded by media.py, videos checked to decode and handed to
mlx-vlm's loader as files; both are placed in the prompt (by
mlx-vlm's chat templating for Messages, at the host's markers for a raw
Prompt), then mlx-vlm's processor expands each into its tokens and makes the
pixel arrays (video frames sampled by its rules and the fps / frame options). The arrays leave as numpy: the engine thread makes its own
MLX arrays from them.
"""

import os
import re
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from common.python_utils import OptionError
from engine import EngineError
from loaders import media_bounds
from loaders.media_bounds import Extent
from loaders.vision_model import each_array, to_host

from . import spec as spec_
from .render_guard import bounded
from .media import MEDIA_MARKER, b64_bytes, content_hash, decode_image, keyed_tokens, open_image
from .spec import RequestSpec

VIDEO_MARKER = r"\[vid-\d+\]"  # the host's marker for the N-th video of a raw Prompt


@dataclass
class VisionInputs:
    """One request's media, ready for the vision batch's prefill."""
    # pixel_values, image_grid_thw, ... as numpy; the processor's other outputs (lists, numbers) as they are
    arrays: Dict[str, Any] = field(default_factory=dict)
    key: List[int] = field(default_factory=list)  # the prompt with media tokens keyed by content hash
    items: int = 0


def _refuse_kinds(parts, spec: RequestSpec) -> None:
    for name, ok in (("Videos", parts.takes_video), ("Audios", parts.takes_audio)):
        if spec.media(name) and not ok:
            raise OptionError(f"{name}: the loaded model ({parts.model_type}) does not take "
                              f"{'video' if name == 'Videos' else 'audio'} input here")


def _check_before_decoding(parts, spec: RequestSpec) -> None:
    """Counts and payload bytes, from the request alone (media_bounds)."""
    bounds = parts.bounds
    media_bounds.check_counts(bounds, len(spec.images), len(spec.videos), len(spec.audios))
    _within_budget(media_bounds.check_bytes, bounds, [(f"{name}[{i}]", item) for name in ("Images", "Videos", "Audios")
                                                      for i, item in enumerate(spec.media(name))])


def _within_budget(check, *args) -> None:
    try:
        check(*args)
    except media_bounds.OverBudget as e:  # a size budget of this server: as a prompt over the context
        raise EngineError("RESOURCE_EXHAUSTED", str(e)) from None


def _open_images(spec: RequestSpec) -> Tuple[list, List[int], List[Extent]]:
    """Each image opened lazily (its header read, nothing decoded), its hash and its size."""
    opened, hashes, extents = [], [], []
    for i, item in enumerate(spec.images):
        field_name = f"Images[{i}]"
        raw = b64_bytes(field_name, item)
        img = open_image(field_name, raw)
        opened.append(img)
        hashes.append(content_hash(raw))
        extents.append(Extent(field_name, *img.size))
    return opened, hashes, extents


def _saved(items, name: str, folder: str):
    """(field name, file path, bytes) of each base64 item, its bytes written to a file of `folder`:
    mlx-vlm's loaders read videos and clips from files."""
    for i, item in enumerate(items):
        field_name = f"{name}[{i}]"
        raw = b64_bytes(field_name, item)
        path = os.path.join(folder, f"{name.lower()}{i}")
        with open(path, "wb") as f:
            f.write(raw)
        yield field_name, path, raw


def _open_videos(parts, spec: RequestSpec, folder: str) -> Tuple[List[str], List[int], List[Extent]]:
    """Each video's bytes in a file of `folder` (mlx-vlm's loader reads files), with its frame size
    and count read from the container's header (no frame decoded)."""
    import cv2

    paths, hashes, extents = [], [], []
    for field_name, path, raw in _saved(spec.videos, "Videos", folder):
        cap = cv2.VideoCapture(path)
        try:
            ok = cap.isOpened()
            frames = int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) if ok else 0
            width, height = (int(cap.get(p)) for p in (cv2.CAP_PROP_FRAME_WIDTH, cv2.CAP_PROP_FRAME_HEIGHT))
        finally:
            cap.release()
        if not ok or frames <= 0 or width <= 0 or height <= 0:
            raise OptionError(f"{field_name}: not a decodable video")
        paths.append(path)
        hashes.append(content_hash(raw))
        extents.append(Extent(field_name, width, height, media_bounds.video_frames(parts.bounds, frames)))
    return paths, hashes, extents


def _check_videos_decode(paths: List[str]) -> None:
    """One frame of each video decodes (its size is already within the bounds)."""
    import cv2

    for i, path in enumerate(paths):
        cap = cv2.VideoCapture(path)
        try:
            ok = cap.read()[0]
        finally:
            cap.release()
        if not ok:
            raise OptionError(f"Videos[{i}]: not a decodable video")


def _open_audios(lm, spec: RequestSpec, folder: str) -> Tuple[List[str], List[int]]:
    """Each clip's bytes in a file of `folder` (mlx-vlm's loader reads files at its processor's
    rate), checked to be audio mlx-audio decodes and within the model's audio_max_seconds."""
    from .audio import probe

    paths, hashes = [], []
    for field_name, path, raw in _saved(spec.audios, "Audios", folder):
        seconds, _ = probe(path, field_name)
        bound = lm.options.audio_max_seconds
        if seconds > bound:
            raise EngineError("RESOURCE_EXHAUSTED", f"{field_name}: {seconds:.1f} seconds of audio; at most {bound:g} "
                              "(option audio_max_seconds)")
        paths.append(path)
        hashes.append(content_hash(raw))
    return paths, hashes


def _raw_prompt(parts, text: str, image_hashes: List[int], video_hashes: List[int],
                audio_hashes: List[int] = ()) -> Tuple[str, List[int]]:
    """Each marker becomes its item's placeholder; the counts must match the items'.
    Returns the prompt and the items' hashes in prompt order. The host's one marker stands for
    images and audio alike: a raw prompt holds one kind or the other."""
    if audio_hashes:
        if image_hashes:
            raise OptionError("Prompt: images and audio in one raw prompt share the one media marker "
                              f"{MEDIA_MARKER!r}, which cannot say which is which: send Messages instead")
        count = text.count(MEDIA_MARKER)
        if count != len(audio_hashes):
            raise OptionError(f"Prompt: {count} media marker(s) {MEDIA_MARKER!r} for {len(audio_hashes)} "
                              "item(s) in Audios")
        text = text.replace(MEDIA_MARKER, parts.audio_block)
        text, _ = _raw_prompt(parts, text, [], video_hashes)
        return text, list(audio_hashes) + list(video_hashes)
    found = [(m.start(), "image") for m in re.finditer(re.escape(MEDIA_MARKER), text)]
    found += [(m.start(), "video") for m in re.finditer(VIDEO_MARKER, text)]
    for kind, name, hashes, marker in (("image", "Images", image_hashes, MEDIA_MARKER),
                                       ("video", "Videos", video_hashes, "[vid-N]")):
        count = sum(1 for _, k in found if k == kind)
        if count != len(hashes):
            raise OptionError(f"Prompt: {count} media marker(s) {marker!r} for {len(hashes)} item(s) in {name}")
    text = text.replace(MEDIA_MARKER, parts.image_block)
    text = re.sub(VIDEO_MARKER, lambda m: parts.video_block, text)
    images, videos = iter(image_hashes), iter(video_hashes)
    return text, [next(images) if k == "image" else next(videos) for _, k in sorted(found)]


def _chat_prompt(lm, spec: RequestSpec, tools, images: int, videos: List[str],
                 template_kwargs: Dict[str, Any], audios: int = 0) -> str:
    """mlx-vlm's chat templating places the images; videos go before the text of the same
    (last) user message, as its video formatting does."""
    from mlx_vlm.prompt_utils import apply_chat_template, get_chat_template

    processor = lm.vision.processor
    kwargs = dict(template_kwargs)
    if tools:
        kwargs["tools"] = tools
    try:
        # The model's config, as mlx-vlm's generation passes it, not config.json's: a family wrapping
        # another architecture is formatted as that one (config.json's type has no image format).
        messages = apply_chat_template(processor, lm.vision.vlm.config, spec.chat_messages(),
                                       add_generation_prompt=True, return_messages=True, num_images=images,
                                       num_audios=audios)
        if any(isinstance(m, str) for m in messages):
            # A family prompted without a chat (PaliGemma): mlx-vlm's formatting makes each message
            # its prompt text, and the prompt is the last one, as its own templating returns it.
            return messages[-1]
        if videos:
            _add_videos(messages, videos)
        bound = spec.bounds
        with bounded("Messages", bound.template_seconds, bound.template_output_bytes):
            return get_chat_template(processor, messages, True, **kwargs)
    except (OptionError, EngineError):
        raise
    except Exception as e:  # jinja errors: the template rejected these messages
        raise OptionError(f"Messages: the chat template failed: {type(e).__name__}: {e}") from None


def _add_videos(messages: List[Dict[str, Any]], paths: List[str]) -> None:
    last = next((m for m in reversed(messages) if m.get("role") == "user"), None)
    if last is None:
        raise OptionError("Videos: there is no user message to hold them")
    content = last.get("content")
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    media = [c for c in content if c.get("type") != "text"]
    text = [c for c in content if c.get("type") == "text"]
    # Each with its file, as mlx-vlm's video formatting writes it: a processor that renders the
    # chat itself (Gemma 4's) keeps only the videos it can find.
    last["content"] = media + [{"type": "video", "video": path} for path in paths] + text


def _expand(lm, text: str, images: list, videos: List[str],
            audios: List[str] = ()) -> Tuple[List[int], Dict[str, np.ndarray]]:
    from mlx_vlm.utils import prepare_inputs, should_add_special_tokens

    parts = lm.vision
    try:
        inputs = prepare_inputs(
            parts.processor, images=images or None, videos=videos or None, audio=list(audios) or None, prompts=text,
            image_token_index=getattr(parts.vlm.config, "image_token_index", None),
            add_special_tokens=should_add_special_tokens(parts.prompt_type, parts.processor),
            **(parts.extra if videos else {}))
    except Exception as e:  # the processor refused these items (size, shape, frame count)
        name = "Audios" if audios and not (images or videos) else "Videos" if videos else "Images"
        raise OptionError(f"{name}: the model's processor refused them: {type(e).__name__}: {e}") from None
    # Everything else the processor made, as mlx-vlm's generation hands it to the model: the attention mask
    # (PaliGemma's and Gemma 3's embedding steps build a 4-D mask from it), and values that are not arrays
    # (Moondream 3's crops per image and their layout: without them its tower takes the crops for images).
    # Their arrays as numpy (bfloat16 ones as their bits): an MLX array made here would belong to this thread's stream.
    arrays = {k: each_array(v, to_host) for k, v in inputs.items() if v is not None and k != "input_ids"}
    ids = np.array(inputs["input_ids"]).reshape(-1).tolist()
    return ids, arrays


def _check_placed(parts, ids: List[int], arrays: Dict[str, np.ndarray]) -> None:
    """The request's media reach the model: at their tokens in the prompt or, for a family
    whose prompt holds none (an encoder-decoder reading the page in its encoder alone:
    Nemotron-Parse names no image token), through the processor's pixel arrays."""
    if set(ids) & set(parts.media_token_ids):
        return
    if not parts.media_token_ids and "pixel_values" in arrays:
        return
    raise OptionError("Images: the prompt has no place for them (the chat template rendered none)")


def _in_prompt_order(ids: List[int], parts, visual: List[int], audio: List[int]) -> List[int]:
    """The items' hashes in the order their runs of tokens stand in the prompt (an audio run is
    one of the audio token; any other run of media tokens is the next image or video)."""
    media = set(parts.media_token_ids)
    visual_it, audio_it, out, prev = iter(visual), iter(audio), [], None
    for t in ids:
        if t in media and t != prev:
            source = audio_it if t == parts.audio_token_id else visual_it
            out.append(next(source, 0))
        prev = t if t in media else None
    return out


def vision_prompt(lm, opts, tools, template_kwargs) -> Optional[Tuple[str, List[int], VisionInputs]]:
    """(prompt text, expanded token ids, media) of a request with media; None when it has none.
    `opts`: the request's spec (spec.read), or its PredictOptions."""
    parts = lm.vision
    spec = spec_.read(lm, opts)
    use_template = spec.chat_rendered
    if not spec.has_media and (use_template or not (MEDIA_MARKER in spec.prompt
                                                    or re.search(VIDEO_MARKER, spec.prompt))):
        if parts.needs_image:
            raise OptionError(f"Images: the loaded model ({parts.model_type}) answers only about an image, and "
                              f"this request has none (mlx-vlm without one: {parts.needs_image})")
        return None  # text only: the text path, exactly as for a text model
    _refuse_kinds(parts, spec)
    _check_before_decoding(parts, spec)
    opened, hashes, extents = _open_images(spec)
    with tempfile.TemporaryDirectory(prefix="mlx-media-") as folder:
        videos, video_hashes, video_extents = _open_videos(parts, spec, folder)
        audios, audio_hashes = _open_audios(lm, spec, folder)
        _within_budget(media_bounds.check_pixels, parts.bounds, extents + video_extents)
        images = [decode_image(f"Images[{i}]", img) for i, img in enumerate(opened)]
        _check_videos_decode(videos)
        if use_template:
            text = _chat_prompt(lm, spec, tools, len(images), videos, template_kwargs, len(audios))
            hashes += video_hashes  # the order they take in the rendered message
        else:
            text, hashes = _raw_prompt(parts, spec.prompt, hashes, video_hashes, audio_hashes)
        ids, arrays = _expand(lm, text, images, videos, audios)
    if images or videos:
        _check_placed(parts, ids, arrays)
    if audios:
        if parts.audio_token_id not in ids:
            raise OptionError("Audios: the prompt has no place for them (the chat template rendered none)")
        if use_template:  # each run of media tokens keyed by its own item, in the order they stand
            hashes = _in_prompt_order(ids, parts, hashes, audio_hashes)
    return text, ids, VisionInputs(arrays=arrays, key=keyed_tokens(ids, parts.media_token_ids, hashes),
                                   items=len(hashes))
