"""What a vision load learns from a test image, before it answers (loading thread).

One chat turn with a small grey picture, prepared and embedded as a request's would be, says:
whether the family's processor sees images at all (mlx-vlm falls back to the bare tokenizer
when a processor cannot be built); which token ids are the family's media tokens where its
config names none (where the embedding step placed the picture); whether a prompt without an
image can be answered; and whether the batch can serve the family exactly (batch_obstacle,
whole_model_steps: the lane choice sends such a family to the solo lane).
"""

from dataclasses import is_dataclass
from typing import Callable, List, Optional


def _test_image_inputs(parts: "VisionParts"):
    """A chat turn with one test image, prepared as a request's is: mlx-vlm's processor's inputs."""
    from PIL import Image
    from mlx_vlm.prompt_utils import apply_chat_template
    from mlx_vlm.utils import prepare_inputs, should_add_special_tokens

    # As mlx-vlm writes the turn (Gemma 3 marks images with its begin-of-image token, not the
    # image token the processor expands).
    prompt = apply_chat_template(parts.processor, parts.vlm.config, "?", num_images=1)
    return prepare_inputs(parts.processor, images=[Image.new("RGB", (64, 64), (128, 128, 128))], prompts=prompt,
                          image_token_index=getattr(parts.vlm.config, "image_token_index", None),
                          add_special_tokens=should_add_special_tokens(parts.prompt_type, parts.processor))


# What a processor makes from the text alone: a test image's inputs must hold more.
_TEXT_INPUTS = {"input_ids", "attention_mask", "token_type_ids"}


def embedded_test_image(parts: "VisionParts"):
    """(prompt ids, the embedding step's outputs) for a test image, as a request's prefill gets
    them; ModelLoadError where the library itself fails (mlx-vlm 0.7.10's LLaVA processor hands
    text options to the image processor, which transformers 5 refuses): refused at load, not
    on every request."""
    from loaders.loaded import ModelLoadError, evaluate

    try:
        inputs = _test_image_inputs(parts)
    except Exception as e:
        raise ModelLoadError(f"mlx-vlm's processor for this family fails on a test image: "
                             f"{type(e).__name__}: {e}") from None
    if not set(inputs) - _TEXT_INPUTS:
        # mlx-vlm's loader falls back to the bare tokenizer when the family's processor cannot be
        # built (Granite Vision without its processor files): the model would load, and
        # every image be dropped without a word.
        raise ModelLoadError(f"mlx-vlm's processor ({type(parts.processor).__name__}) makes no image inputs from "
                             f"a test image, so every image would be dropped: are the folder's "
                             f"processor files (preprocessor_config.json) missing?")
    ids = inputs["input_ids"]
    rest = {k: v for k, v in inputs.items() if k not in ("input_ids", "pixel_values", "attention_mask")}
    try:
        features = parts.vlm.get_input_embeddings(ids, inputs.get("pixel_values"),
                                                  mask=inputs.get("attention_mask"), **rest)
        # Computed here, though only its shapes are read: what the library cached while building
        # it (LFM2-VL's position-embedding resize tables) must not stay bound to this thread.
        evaluate(features)
    except Exception as e:
        raise ModelLoadError(f"mlx-vlm's embedding step fails on a test image: {type(e).__name__}: {e}") from None
    return ids, features


def placed_token_ids(vlm, ids, features) -> List[int]:
    """The token ids whose embeddings the test image's features replaced or changed: the
    family's media tokens, for a config that names none (Molmo's processor writes <im_patch>
    runs its config never mentions; Moondream 3's holds the image at runs of id 0). Read from
    what the embedding step did, not from a name: the same prompt embedded without the image
    differs exactly there. Empty when the step cannot embed without pixels or changes the
    prompt's length (the batch_obstacle case)."""
    import mlx.core as mx
    import numpy as np

    from loaders.loaded import evaluate

    try:
        plain = vlm.get_input_embeddings(ids, None).inputs_embeds
        evaluate(plain)
    except Exception:  # a family whose step wants its own inputs even without an image
        return []
    placed = features.inputs_embeds
    if plain.shape != placed.shape:
        return []
    changed = mx.any(plain.astype(mx.float32) != placed.astype(mx.float32), axis=-1).reshape(-1)
    return sorted({int(t) for t in np.array(ids).reshape(-1)[np.array(changed)]})


def media_tokens(named: List[int], test_ids: List[int], placed: Callable[[], List[int]],
                 video_id: Optional[int]) -> List[int]:
    """The ids a request's media sit at: those the config names when the test image's prompt holds
    one of them, else where the test image landed (`placed()`), with the video token. A config may
    name none, or only ids its processor never writes: Phi-3-Vision's config class keeps
    PaliGemma's image_token_index (257152) while its processor writes -N for image N. When the
    embedding step shows nothing either, the named ids stay: a request is then refused for want
    of a place, never served with its image unseen."""
    if set(named) & set(test_ids):
        return list(named)
    found = set(placed())
    if named and not found:
        return list(named)
    return sorted(found | ({video_id} if video_id is not None else set()))


def whole_model_steps(vlm) -> Optional[str]:
    """Why the batch cannot decode this family (None: it can) when its language model is the
    whole model: mlx-vlm then runs every step through the VLM's own call, which keeps the last
    image's state on the module (MolmoPoint: the point predictor's keys, the tokens generated
    so far). The batch runs every row through that one module: a second request's image would
    replace the first's state while both decode, and one request's points would come from
    another's picture (its text does not show it until the model points)."""
    if getattr(vlm, "language_model", None) is vlm:
        return ("its language model is the whole model, which keeps the last image's state between steps "
                "(mlx-vlm's own generation runs one request through it at a time); the batch would share "
                "that state between its requests")


def text_alone_fails(parts: "VisionParts", tokenizer) -> Optional[str]:
    """Why mlx-vlm's embedding step refuses a prompt without an image (None: it takes it). A family
    that reads every answer from an image (Nemotron-Parse's decoder cross-attends to the page, and
    there is none without one) would fail each such request inside the library's step: refused
    as the request's fault instead."""
    import mlx.core as mx

    from loaders.loaded import evaluate

    text = mx.array([tokenizer.encode("Describe this.")])
    try:
        evaluate(parts.vlm.get_input_embeddings(text, None, mask=mx.ones(text.shape, dtype=mx.int32)))
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


def batch_obstacle(ids, features) -> Optional[str]:
    """Why the batch cannot give mlx-vlm's text for this family (None: it can), from a test
    image's prompt ids and embedding-step outputs. mlx-vlm's own generation step (the solo
    lane, engine/lane_choice.py) serves such a family; the batch does not:
    - embeddings longer or shorter than the prompt (mlx-vlm's LLaVA-NeXT puts all of an
      image's features at the first of the image tokens its processor wrote, and keeps the
      rest): mlx-vlm prefills the embeddings' positions, the batch places and caches a
      request by its tokens;
    - image states the text layers cross-attend to at every decode step (Llama 3.2 Vision),
      or a decoder's own inputs beside the encoder's (encoder-decoder families): mlx-vlm
      hands them to each step, the batch's decode has no per-request place for them."""
    if features.inputs_embeds.shape[1] != ids.shape[1]:
        return (f"its embedding step makes {features.inputs_embeds.shape[1]} positions of a {ids.shape[1]}-token "
                f"prompt with an image: mlx-vlm prefills those positions, the batch the prompt's tokens")
    for name in ("cross_attention_states", "decoder_inputs_embeds"):
        if getattr(features, name, None) is not None:
            return (f"its language model reads the image's {name} at every decode step, as mlx-vlm's own "
                    f"generation hands them over; the batch's decode has no per-request place for them")
    return None


# GOT-OCR's config names its image token im_patch_token (<imgpad>); Jina-VLM's, image_patch_token_id (its
# processor writes each image as crops of patch tokens framed by others, the image token itself gone).
MEDIA_TOKENS = ("image_token_id", "image_token_index", "video_token_id", "im_patch_token", "image_patch_token_id")


def token_config(cfg):
    """The part of the model's config that names its media tokens: the config itself, else the
    one of its parts that does (Qwen3-Omni's wraps a thinker_config, which holds the tower, the
    text model and their token ids)."""
    def names(c) -> bool:
        return any(isinstance(getattr(c, name, None), int) for name in MEDIA_TOKENS)

    parts = [v for v in vars(cfg).values() if is_dataclass(v)] if is_dataclass(cfg) else []
    return next((c for c in [cfg] + parts if names(c)), cfg)
