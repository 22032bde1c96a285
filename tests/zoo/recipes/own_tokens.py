"""Recipes: Processors that write an image's tokens themselves: Molmo, Molmo 2, MolmoPoint, Moondream 3.
"""

from zoo.recipes.base import CLIP_MEAN, CLIP_STD, Recipe, _add, _turns
from zoo.vision_shrink import VISION, WIDTH, shrink


# ---- Molmo: a CLIP-like tower on overlapping crops (a global view first), 2x2 attention pooling, its own text
# model (fused QKV, extra embedding rows). Its processor writes each image's tokens itself, ahead of the text, and the
# checkpoints' tokenizer has no chat template (mlx-vlm then prompts with the bare question). Crops of 112 pixels: 8x8
# patches of 14, pooled to 4x4 tokens; margins of two patches (even, or the processor's token count and its patch
# order disagree) leave a 4-patch window between crops.

MOLMO_SPECIALS = ["<|endoftext|>", "<im_start>", "<im_end>", "<im_patch>", "<im_col>", "<|image|>"]
_MOLMO_CROP, _MOLMO_PATCH = 112, 14


def _molmo(m, ids, vocab):
    # Its own names for the text model's sizes (the generic shrink knows none of them).
    text = shrink(m.TextConfig, model_type="molmo", d_model=WIDTH, n_heads=2, n_kv_heads=1, n_layers=2,
                  mlp_hidden_size=4 * WIDTH, vocab_size=vocab, embedding_size=vocab, additional_vocab_size=8)
    vision = shrink(m.VisionConfig, model_type="molmo", image_default_input_size=[_MOLMO_CROP, _MOLMO_CROP],
                    image_patch_size=_MOLMO_PATCH, image_pos_patch_size=_MOLMO_PATCH,
                    image_num_pos=(_MOLMO_CROP // _MOLMO_PATCH) ** 2 + 1, image_emb_dim=WIDTH, image_num_heads=2,
                    image_num_key_value_heads=2, image_num_layers=2, image_head_dim=16, image_mlp_dim=2 * WIDTH,
                    d_model=WIDTH, vit_layers=[-1, -2],
                    intermediate_size=None)  # here the patch's pixel count, derived from the patch size
    return {"model_type": "molmo", "text_config": text, "vision_config": vision, "vocab_size": vocab,
            "eos_token_id": [ids["<|endoftext|>"]]}


_add("molmo", Recipe(
    specials=MOLMO_SPECIALS, eos="<|endoftext|>", template=None, config=_molmo,
    files={"preprocessor_config.json": {"max_crops": 4, "overlap_margins": [2, 2],
                                        "base_image_input_size": [_MOLMO_CROP, _MOLMO_CROP],
                                        "image_token_length_w": 4, "image_token_length_h": 4,
                                        "image_patch_size": _MOLMO_PATCH, "image_padding_mask": True,
                                        "image_mean": CLIP_MEAN, "image_std": CLIP_STD}}))


# ---- Molmo 2: Molmo's crops (the low-resolution view first) on a SigLIP-like tower, attention pooling over 2x2
# patches, a Qwen3-like text model; its token ids are config fields. Its processor expands each <|image|> of the
# chat into the image's tokens. mlx-vlm's loader replaces the processor's image processor with one made with no
# arguments (the module's ImageProcessor), so crops are always 378 pixels, 27x27 patches of 14 pooled to 14x14 tokens
# (a picture of the test's size: a low-resolution view and one crop, some 420 tokens): the tower takes 729 positions,
# and one block of it is most of a request's time here.
# The tower's and the adapter's configs have no "Vision" in their names: the generic shrink is told which table.


MOLMO2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|image|>", "<im_patch>", "<im_low>", "<im_start>",
                   "<low_res_im_start>", "<im_end>", "<im_col>", "<frame_start>", "<frame_end>"]
MOLMO2_TEMPLATE = _turns("{{ '<|im_start|>' + message['role'] + '\\n' }}", "<|image|>", "<|im_end|>\\n",
                         "<|im_start|>assistant\\n")


def _molmo2_ids(ids) -> dict:
    return {"image_start_token_id": ids["<im_start>"], "low_res_image_start_token_id": ids["<low_res_im_start>"],
            "image_end_token_id": ids["<im_end>"], "image_low_res_id": ids["<im_low>"],
            "image_patch_id": ids["<im_patch>"], "image_col_id": ids["<im_col>"],
            "frame_start_token_id": ids["<frame_start>"], "frame_end_token_id": ids["<frame_end>"],
            "eos_token_id": [ids["<|im_end|>"]]}


def _molmo2_tower(vit_class, adapter_class):
    """(the tower's config, the adapter's): one block at the 378-pixel crops the processor makes, pooled into
    the text model's width."""
    def sized(config_class, **fields):
        return shrink(config_class, VISION, num_key_value_heads=2, head_dim=16, **fields)

    return (sized(vit_class, image_default_input_size=[378, 378], image_patch_size=14, image_num_pos=27 * 27),
            sized(adapter_class, text_hidden_size=WIDTH, vit_layers=[-1]))


def _molmo2(m, ids, vocab):
    vit, adapter = _molmo2_tower(m.VitConfig, m.AdapterConfig)
    return {"model_type": "molmo2", "text_config": shrink(m.TextConfig, model_type="molmo2", vocab_size=vocab,
                                                          additional_vocab_size=8),
            "vision_config": {"vit_config": vit, "adapter_config": adapter}, **_molmo2_ids(ids)}


_add("molmo2", Recipe(specials=MOLMO2_SPECIALS, eos="<|im_end|>", template=MOLMO2_TEMPLATE, config=_molmo2,
                      scale=2.0))  # at 4x one picture's text is one token repeated


# ---- Moondream 3: a SigLIP-like tower on a global 378-pixel crop and local crops (pooled back to its 27x27 grid), a
# MoE text model with learned temperatures and partial RoPE. Its processor writes the prompt itself (BOS, 729
# placeholders of id 0, "Question: ... Answer: ", the answer token 3): the 729 and those ids are fixed in its code,
# so the tower keeps 378-pixel crops of 14-pixel patches, and the tokenizer's first specials sit at ids 0 and 3 (its
# end-of-text, id 0, is also the BOS and the placeholder). No chat template: mlx-vlm hands it the bare question.

MOONDREAM_SPECIALS = ["<|endoftext|>", "<|md_reserved_0|>", "<|md_reserved_1|>", "<|md_answer|>", "<|md_thinking|>"]


def _moondream3(m, ids, vocab):
    assert ids["<|endoftext|>"] == 0 and ids["<|md_answer|>"] == 3  # the ids its processor writes
    # As many key-value heads as heads: its learned temperature scales the values per query head.
    text = shrink(m.TextConfig, vocab_size=vocab, num_key_value_heads=2, rope_dim=8, moe_start_layer=1)
    vision = shrink(m.VisionConfig, crop_size=378, patch_size=14, max_crops=2, proj_inner_dim=2 * WIDTH,
                    proj_out_dim=WIDTH)
    return {"model_type": "moondream3", "text_config": text, "vision_config": vision, "eos_token_id": 0,
            "bos_token_id": 0}


_add("moondream3", Recipe(specials=MOONDREAM_SPECIALS, eos="<|endoftext|>", template=None, config=_moondream3))


# ---- MolmoPoint: Molmo 2 that points: the same crops, tower and text model, plus a point predictor whose patch,
# subpatch and location tokens extend the vocabulary past the head's rows (its config names the tokens they stand
# for). Its processor marks the low-resolution view's patches <im_low> (not indexable by a point) and puts a BOS
# first; mlx-vlm's loader makes its image processor with no arguments, as for Molmo 2, and its sanitize casts every
# float32 weight to float16 (it runs in float16, in the library and here). The point tokens are specials, so their
# rows of the head are shrunk and the tiny model's text never points: what is compared is its text.

MOLMO_POINT_SPECIALS = MOLMO2_SPECIALS + ["<|point_patch|>", "<|point_subpatch|>", "<|point_location|>"]


def _molmo_point(m, ids, vocab):
    vit, adapter = _molmo2_tower(m.VisionConfig, m.AdapterConfig)
    molmo2 = _molmo2_ids(ids)
    return {"model_type": "molmo_point", "text_config": shrink(m.TextConfig, vocab_size=vocab, additional_vocab_size=8),
            "vision_config": vit, "adapter_config": adapter, "patch_embed_dim": 16,
            **{k: molmo2[k] for k in ("image_start_token_id", "image_end_token_id", "image_patch_id", "image_col_id",
                                      "frame_start_token_id", "frame_end_token_id", "eos_token_id")},
            "image_high_res_id": ids["<im_patch>"], "image_non_indexable_patch_id": ids["<im_low>"],
            "patch_token_id": ids["<|point_patch|>"], "subpatch_token_id": ids["<|point_subpatch|>"],
            "location_token_id": ids["<|point_location|>"]}


_add("molmo_point", Recipe(specials=MOLMO_POINT_SPECIALS, eos="<|im_end|>", template=MOLMO2_TEMPLATE,
                           config=_molmo_point, scale=2.0))
