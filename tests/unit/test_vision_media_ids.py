"""The media tokens of a vision model, learned at load where its config names none
(loaders/vision_model.placed_token_ids), without a server.

Molmo's config names no image token: its processor writes <im_start>, runs of <im_patch>
split by <im_col>, and <im_end> around each image, and only the <im_patch> positions take
image features. Loaded, the model's media tokens must be exactly that one id (read here
from the tokenizer, not from the loader), and a request with an image must be accepted
(before, preparation refused it: "the prompt has no place for them"). For Qwen2-VL, whose
config names its tokens, what the embedding step changed is the config's image token.
"""

import pytest

pytest.importorskip("mlx.core")

import backend_pb2  # noqa: E402
from prepare.media import MEDIA_MARKER  # noqa: E402
from prepare.vision import vision_prompt  # noqa: E402
from vision_fixture import image_b64, tiny_vision  # noqa: E402


def _load(family):
    from loaders.model_loader import LoadSpec, load

    return load(LoadSpec(model=tiny_vision(family)))


def test_a_config_without_an_image_token_learns_it_from_the_embedding_step():
    lm = _load("molmo")
    patch = lm.tokenizer.convert_tokens_to_ids("<im_patch>")
    assert lm.vision.media_token_ids == [patch]
    prompt = backend_pb2.PredictOptions(Prompt=f"{MEDIA_MARKER}Describe this.", Images=[image_b64(1)])
    _, ids, media = vision_prompt(lm, prompt, [], {})
    assert patch in ids and media.items == 1
    assert all(k < 0 for t, k in zip(ids, media.key) if t == patch)  # keyed by the image's hash


def test_the_placed_tokens_are_the_configs_image_token_where_it_names_one():
    from loaders.vision_model import _embedded_test_image, placed_token_ids

    lm = _load("qwen2_vl")
    ids, features = _embedded_test_image(lm.vision)
    assert placed_token_ids(lm.vision.vlm, ids, features) == [lm.vision.vlm.config.image_token_id]
