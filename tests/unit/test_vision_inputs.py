"""What preparation makes of a vision request, without a server: the model's media tokens,
learned at load where its config names none (loaders/vision_probe.placed_token_ids), and
every processor output the library's own generation hands the model.

Molmo's config names no image token: its processor writes <im_start>, runs of <im_patch>
split by <im_col>, and <im_end> around each image, and only the <im_patch> positions take
image features. Loaded, the model's media tokens must be exactly that one id (read here
from the tokenizer, not from the loader), and a request with an image must be accepted
(before, preparation refused it: "the prompt has no place for them"). For Qwen2-VL, whose
config names its tokens, what the embedding step changed is the config's image token.

Moondream 3's processor returns, beside its pixels, the crops per image and their layout
as lists: its tower needs them to tell an image's crops apart (without them it took the
two crops of one picture for two pictures and the request failed). They must reach the
engine as the library's processor made them.

MolmoPoint keeps the last image's state on its module, so it must not be batched; and a
raw prompt's image marker, for a processor that names no image token, must become what
mlx-vlm's chat formatting writes for one image.
"""

import pytest

pytest.importorskip("mlx.core")

import backend_pb2  # noqa: E402
from prepare.media import MEDIA_MARKER  # noqa: E402
from prepare.vision import vision_prompt  # noqa: E402
from vision_fixture import image_b64, tiny_vision  # noqa: E402


def _chat(seed):
    """One user turn with one picture, templated as mlx-vlm templates it."""
    return backend_pb2.PredictOptions(Messages=[backend_pb2.Message(role="user", content="Describe this.")],
                                      UseTokenizerTemplate=True, Images=[image_b64(seed)])


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
    from loaders.vision_probe import embedded_test_image, placed_token_ids

    lm = _load("qwen2_vl")
    ids, features = embedded_test_image(lm.vision)
    assert placed_token_ids(lm.vision.vlm, ids, features) == [lm.vision.vlm.config.image_token_id]



def test_a_named_image_token_the_processor_never_writes_gives_way_to_where_the_image_landed():
    """Phi-3-Vision: its config class keeps PaliGemma's image_token_index (257152), its processor
    writes -1 for the first image. Before, every image request was refused ("no place for them")."""
    from loaders.vision_probe import media_tokens

    asked = []

    def placed():
        asked.append(1)
        return [-1]

    assert media_tokens([257152], [4, -1, -1, -1, 7], placed, None) == [-1]
    assert media_tokens([257152], [4, -1, 7], placed, 11) == [-1, 11]  # and the video token, as for none named
    assert len(asked) == 2
    assert media_tokens([9, 10], [4, 9, 9, 7], placed, None) == [9, 10]  # named and written: kept, nothing probed
    assert len(asked) == 2
    assert media_tokens([], [4, 5], lambda: [], 11) == [11]
    # Nothing learned either: the config's ids stay, and a request is refused rather than served blind.
    assert media_tokens([257152], [4, -1, 7], lambda: [], 11) == [257152]


def test_the_processors_outputs_that_are_not_arrays_reach_the_engine():
    import base64
    import io

    import numpy as np
    from PIL import Image
    from mlx_vlm.prompt_utils import apply_chat_template
    from mlx_vlm.utils import prepare_inputs

    from engine.lanes.vision_batch import engine_arrays

    lm = _load("moondream3")
    _, ids, media = vision_prompt(lm, _chat(1), [], {})
    parts = lm.vision
    image = Image.open(io.BytesIO(base64.b64decode(image_b64(1)))).convert("RGB")
    own = prepare_inputs(parts.processor, images=[image],
                         prompts=apply_chat_template(parts.processor, parts.vlm.config, "Describe this.", num_images=1))
    assert ids == np.array(own["input_ids"]).reshape(-1).tolist()
    for name in ("num_crops", "crop_layouts"):
        assert media.arrays[name] == own[name], name
    made = engine_arrays(media)
    assert made["num_crops"] == own["num_crops"] and made["pixel_values"].shape == own["pixel_values"].shape


def test_the_processors_arrays_reach_the_engine_with_their_dtype_and_values():
    """A processor's arrays go to the prep thread's numpy and back to MLX on the engine thread
    (vision_batch.engine_arrays): DeepSeek-OCR's processors make bfloat16 pixels, which numpy
    has no type for (the first request failed at LoadModel's check); every dtype comes back as
    made, bit for bit, through the lists and dicts processors nest arrays in."""
    import mlx.core as mx
    from types import SimpleNamespace

    from engine.lanes.vision_batch import engine_arrays
    from loaders.vision_model import each_array, to_host

    pixels = mx.random.normal((2, 3, 8, 8), key=mx.random.key(3))
    made = {"images": [pixels.astype(mx.bfloat16), pixels], "mask": mx.array([[True, False]]),
            "crop": {"grid": mx.array([[1, 2]], dtype=mx.int64), "half": pixels[0].astype(mx.float16)}, "count": 3}
    back = engine_arrays(SimpleNamespace(arrays=each_array(made, to_host)))
    pairs = [(made["images"][0], back["images"][0]), (made["images"][1], back["images"][1]),
             (made["mask"], back["mask"]), (made["crop"]["grid"], back["crop"]["grid"]),
             (made["crop"]["half"], back["crop"]["half"])]
    for want, got in pairs:
        assert isinstance(got, mx.array) and got.dtype == want.dtype and got.shape == want.shape
        assert mx.array_equal(got, want).item()
    assert back["count"] == 3 and isinstance(back["images"], list)


def test_a_model_that_keeps_the_images_state_on_itself_is_not_batched():
    """MolmoPoint's language model is the whole model: its next step's point logits come from the
    last image it embedded, kept on the module. Two requests in one batch would share it (shown
    here with the library's model alone), so the loader sends it to the solo lane."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from engine.lanes.vision_batch import engine_arrays

    lm = _load("molmo_point")
    vlm, vocab = lm.vision.vlm, lm.tokenizer.vocab_size

    def prepared(seed):
        _, ids, media = vision_prompt(lm, _chat(seed), [], {})
        return mx.array([ids]), engine_arrays(media)

    def prefilled(ids, arrays):
        cache = make_prompt_cache(vlm.language_model)
        pixels = arrays.pop("pixel_values")
        embeds = vlm.get_input_embeddings(ids, pixels, **arrays).inputs_embeds
        token = mx.argmax(vlm(ids, inputs_embeds=embeds, cache=cache).logits[:, -1, :vocab], axis=-1)
        return cache, token[:, None]

    first, second = prepared(1), prepared(2)
    cache, token = prefilled(*first)
    alone = vlm(token, cache=cache).logits[0, -1]
    cache, token = prefilled(*prepared(1))
    prefilled(*second)  # a second request joins before the first's next step
    shared = vlm(token, cache=cache).logits[0, -1]
    assert mx.array_equal(alone[:vocab], shared[:vocab])  # its text alone does not show it
    assert not mx.array_equal(alone[vocab:], shared[vocab:])  # its points come from the other picture
    assert "whole model" in lm.vision.batch_obstacle


@pytest.mark.parametrize("family, turn", [
    ("molmo2", "<|im_start|>user\n{}Describe this.<|im_end|>\n<|im_start|>assistant\n"),
    ("molmo", "{}Describe this.")])
def test_a_raw_prompts_image_marker_becomes_what_the_chat_formatting_writes(family, turn):
    """A host that renders the template itself marks the image; for a processor that names no
    image token, the marker must become what mlx-vlm's formatting writes for one image (Molmo
    2's <|image|>; for Molmo, whose processor writes the image's tokens itself, nothing): the
    prompt is then the one the same chat turn gives."""
    lm = _load(family)
    raw = backend_pb2.PredictOptions(Prompt=turn.format(MEDIA_MARKER), Images=[image_b64(1)])
    assert vision_prompt(lm, raw, [], {})[1] == vision_prompt(lm, _chat(1), [], {})[1]
