"""Recipes: MiniCPM: MiniCPM-V 4.6 and 4.7, MiniCPM-o (image slices, per-image list outputs).
"""

from vision_fixture import CHAT_TEMPLATE

from zoo.recipes.base import Recipe, _MROPE, _MROPE_PARTIAL, _add, module_of
from zoo.vision_shrink import shrink


# ---- MiniCPM-V 4.6: a SigLIP tower merged 16x (a window merger after its first layer, then 2x2), a Qwen 3.5 text
# model; mlx-vlm's own processor resizes to multiples of 4 patches, cuts a picture of more than scale_resolution
# squared pixels into slices after its thumbnail (the 160x120 test picture: two side by side; the 96x128 one: none)
# and fills each one's <image>/<slice> span with <|image_pad|>. The config names no image token; the processor's
# outputs are lists per image.

MINICPM_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "</image>", "<slice>", "</slice>",
                    "<image_id>", "</image_id>", "<unk>", "<|image_pad|>", "<|video_pad|>"]
_MINICPM_SIDE = 112  # pixels a slice is resized to: 8x8 patches of 14, 4 image tokens after the 16x merge


def _minicpmv4_6(m, ids, vocab):
    return {"model_type": "minicpmv4_6",
            "text_config": shrink(m.TextConfig, model_type="qwen3_5", vocab_size=vocab,
                                  rope_parameters=_MROPE_PARTIAL),
            "vision_config": shrink(m.VisionConfig, model_type="siglip_vision_model", num_hidden_layers=2,
                                    image_size=_MINICPM_SIDE, patch_size=14),
            "insert_layer_id": 0, "image_size": _MINICPM_SIDE, "patch_size": 14, "vocab_size": vocab,
            "eos_token_id": [ids["<|im_end|>"]]}


MINICPM_FILES = {"preprocessor_config.json": {"patch_size": 14, "scale_resolution": _MINICPM_SIDE,
                                              "max_slice_nums": 2, "image_feature_size": 4}}

_add("minicpmv4_6", Recipe(specials=MINICPM_SPECIALS, eos="<|im_end|>", template=CHAT_TEMPLATE, config=_minicpmv4_6,
                           files=MINICPM_FILES))


# ---- MiniCPM-V 4.7: 4.6's tower and processing, thumbnails and slices placed on a 3-D canvas of positions (from
# the crop grids, in its embedding step), a Qwen 3.5 MoE text model; its config names the tokens the canvas reads
# (the pictures here cut into one row of slices at most, so no newline token is written between rows).

def _minicpmv4_7(m, ids, vocab):
    text = shrink(module_of("qwen3_5_moe").TextConfig, model_type="qwen3_5_moe_text", vocab_size=vocab,
                  rope_parameters=_MROPE_PARTIAL)
    return {**_minicpmv4_6(m, ids, vocab), "model_type": "minicpmv4_7", "text_config": text,
            "image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
            "image_start_id": ids["<image>"], "image_end_id": ids["</image>"], "slice_start_id": ids["<slice>"],
            "slice_end_id": ids["</slice>"]}


# Its tower louder: at the default scale two pictures of one size gave one answer (the image did not matter).
_add("minicpmv4_7", Recipe(specials=MINICPM_SPECIALS, eos="<|im_end|>", template=CHAT_TEMPLATE, config=_minicpmv4_7,
                           files=MINICPM_FILES, scaled={"vision": 8.0}))


# ---- MiniCPM-o: a SigLIP tower, a resampler to query_num tokens an image, a Qwen 3 text model (mlx-vlm's Qwen3-VL
# language model, multimodal RoPE over 1-D text positions); images only (no audio tower, no speech). Its processor
# resizes the whole picture (no slices) and writes <image>, query_num <unk>, </image>: neither it nor the config
# names an image token.

def _minicpmo(m, ids, vocab):
    return {"model_type": "minicpmo",
            "text_config": shrink(m.TextConfig, model_type="qwen3", vocab_size=vocab, rope_scaling=_MROPE),
            "vision_config": shrink(m.VisionConfig, model_type="siglip_vision_model", num_hidden_layers=2,
                                    image_size=_MINICPM_SIDE, patch_size=14),
            "query_num": 4, "image_size": _MINICPM_SIDE, "patch_size": 14, "init_audio": False, "init_tts": False,
            "vocab_size": vocab, "eos_token_id": [ids["<|im_end|>"]]}


_add("minicpmo", Recipe(specials=MINICPM_SPECIALS, eos="<|im_end|>", template=CHAT_TEMPLATE, config=_minicpmo,
                        files={"preprocessor_config.json": {"patch_size": 14, "scale_resolution": _MINICPM_SIDE,
                                                            "image_feature_size": 4}}))
