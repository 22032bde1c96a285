"""Recipes: Encoder-decoder and Falcon families (florence2, nemotron_parse, falcon_ocr, falcon_perception).
"""

from zoo.recipes.base import Recipe, _add
from zoo.vision_shrink import WIDTH, shrink


# ---- Florence-2: a DaViT tower (two stages here, strides 4 then 2), a BART encoder-decoder. Prompt only: its
# processor writes <image> times the image processor's image_seq_length, <s>, the question, </s>; the model drops
# those <image> tokens and puts the image's features first in the encoder's input, the decoder starting at </s>.
# <loc_0> in the vocabulary keeps mlx-vlm's processor patch from adding its 1000 location tokens past the model's.

FLORENCE_SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<image>", "<loc_0>"]
_FLORENCE_SIZE = 32  # pixels: a 4x4 grid after the two strides, 16 features plus their average


def _florence2(m, ids, vocab):
    special = {"pad_token_id": ids["<pad>"], "bos_token_id": ids["<s>"], "eos_token_id": ids["</s>"]}
    text = {"d_model": WIDTH, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2,
            "decoder_attention_heads": 2, "encoder_ffn_dim": 2 * WIDTH, "decoder_ffn_dim": 2 * WIDTH,
            "decoder_start_token_id": ids["</s>"], **special}
    vision = {"depths": [1, 1], "dim_embed": [16, WIDTH], "num_heads": [2, 2], "num_groups": [2, 2], "window_size": 2,
              "patch_size": [7, 3], "patch_stride": [4, 2], "patch_padding": [3, 1], "patch_prenorm": [False, True],
              "image_size": [_FLORENCE_SIZE, _FLORENCE_SIZE]}
    return {"model_type": "florence2", "text_config": shrink(m.TextConfig, model_type="florence2", vocab_size=vocab,
                                                             **text),
            "vision_config": shrink(m.VisionConfig, model_type="davit", **vision),
            "image_token_id": ids["<image>"], "image_token_index": ids["<image>"], "vocab_size": vocab, **special}


_add("florence2", Recipe(
    specials=FLORENCE_SPECIALS, eos="</s>", template=None, config=_florence2,
    named={"bos_token": "<s>", "unk_token": "<unk>"},
    files={"preprocessor_config.json": {
        "image_processor_type": "CLIPImageProcessor", "processor_class": "Florence2Processor",
        "size": {"height": _FLORENCE_SIZE, "width": _FLORENCE_SIZE}, "crop_size": {"height": _FLORENCE_SIZE,
                                                                                  "width": _FLORENCE_SIZE},
        "do_resize": True, "do_center_crop": False, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True,
        "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225], "resample": 3,
        "image_seq_length": (_FLORENCE_SIZE // 8) ** 2 + 1}}))


# ---- Nemotron-Parse: a C-RADIO ViT and its neck (columns merged 4 to 1, a summary token) as the encoder, an mBART
# decoder seeded with the prompt's tokens. Its image processor pads every page to 2048x1664 pixels whatever the
# checkpoint says; patches of 64 keep that to 32x26 patches (a real checkpoint's 16 make 13312).

NEMOTRON_PARSE_SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<predict_bbox>", "<output_markdown>"]


def _nemotron_parse(m, ids, vocab):
    special = {"pad_token_id": ids["<pad>"], "bos_token_id": ids["<s>"], "eos_token_id": ids["</s>"],
               "decoder_start_token_id": ids["</s>"]}
    text = {"d_model": WIDTH, "decoder_layers": 2, "decoder_attention_heads": 2, "decoder_ffn_dim": 2 * WIDTH}
    vision = {"hidden_size": WIDTH, "num_heads": 2, "num_layers": 1, "patch_size": 64, "neck_dim": WIDTH}
    return {"model_type": "nemotron_parse", "vocab_size": vocab, "tie_word_embeddings": True, **special,
            # Where mlx-vlm's loader rebuilds the sub-configs from: the config's own reading of a checkpoint's
            # encoder and decoder entries is replaced by them (the encoder's, absent, by the full-size defaults).
            "vision_config": shrink(m.VisionConfig, **vision),
            "text_config": shrink(m.TextConfig, vocab_size=vocab, **text, **special)}


# Scaled 8: the pictures fill a few of the page's patches, the rest is white padding; at 4 the text after its
# first token was the same cycle for both.
_add("nemotron_parse", Recipe(specials=NEMOTRON_PARSE_SPECIALS, eos="</s>", template=None, config=_nemotron_parse,
                              scale=8.0, named={"bos_token": "<s>", "unk_token": "<unk>"}))


# ---- Falcon OCR: no vision tower, each 16-pixel patch projected into the text model (its processor writes the
# image's start, four registers, a token per patch and its end); one decoder with 1-D and golden 2-D rotary halves,
# attention both ways inside an image. Prompt only: the processor turns the question into its OCR instruction (an
# unknown category reads as plain text). Its token ids are config fields, set here to the tokenizer's.

FALCON_SPECIALS = ["<|pad|>", "<|end_of_text|>", "<|image|>", "<|image_cls|>", "<|image_reg_1|>", "<|image_reg_2|>",
                   "<|image_reg_3|>", "<|image_reg_4|>", "<|end_of_image|>", "<|OCR_PLAIN|>"]


def _falcon_ids(ids) -> dict:
    return {"img_id": ids["<|image|>"], "eos_id": ids["<|end_of_text|>"], "img_end_id": ids["<|end_of_image|>"],
            "image_cls_token_id": ids["<|image_cls|>"],
            **{f"image_reg_{i}_token_id": ids[f"<|image_reg_{i}|>"] for i in range(1, 5)},
            "eos_token_id": [ids["<|end_of_text|>"]]}


def _falcon_ocr(m, ids, vocab):
    return {**shrink(m.TextConfig, vocab_size=vocab), "model_type": "falcon_ocr", **_falcon_ids(ids)}


# Its rotary tables (cos_1d, sin_1d) are arrays of the model: scaled as the matrices are, they would not rotate.
_add("falcon_ocr", Recipe(specials=FALCON_SPECIALS, eos="<|end_of_text|>", template=None, config=_falcon_ocr,
                          unscaled=("cos_1d", "sin_1d")))


# ---- Falcon Perception: Falcon OCR's patches-into-the-decoder design, prompted to segment the question's
# expressions, with coordinate and size heads whose outputs feed back into the next step's input (the model keeps
# that state between the library's steps). Its segmentation upsampler (AnyUp, sized in code) is left out
# (do_segmentation: false): it makes masks, never text.

PERCEPTION_SPECIALS = FALCON_SPECIALS[:-1] + ["<|start_of_query|>", "<|REF_SEG|>", "<|coord|>", "<|size|>", "<|seg|>"]


def _falcon_perception(m, ids, vocab):
    heads = {f"{kind}_{part}_dim": dim for kind in ("coord", "size")
             for part, dim in (("enc", 16), ("dec", 2 * WIDTH), ("out", 16))}
    return {**shrink(m.TextConfig, vocab_size=vocab), "model_type": "falcon_perception", **_falcon_ids(ids), **heads,
            "coord_token_id": ids["<|coord|>"], "size_token_id": ids["<|size|>"], "seg_token_id": ids["<|seg|>"],
            "do_segmentation": False}


_add("falcon_perception", Recipe(specials=PERCEPTION_SPECIALS, eos="<|end_of_text|>", template=None,
                                 config=_falcon_perception, unscaled=("cos_1d", "sin_1d")))
