"""Recipes: Families whose vision towers mlx-vlm fixes in code, the tower kept at that size (seeded random
weights), everything else tiny.
"""

from zoo.recipes.base import Recipe, _add, _turns
from zoo.recipes.single_run import LLAVA_TEMPLATE
from zoo.recipes.tiled import DEEPSEEK_SPECIALS, DEEPSEEK_TEMPLATE
from zoo.vision_shrink import WIDTH, shrink


# ---- FastVLM (model_type llava_qwen2): the FastViTHD tower (44 blocks, 96 to 1536 wide, ~125 M parameters; class
# attributes, no config field sizes it), a 2-layer GELU projector from its 3072 channels, a Qwen2 text model, the
# image spliced in at <image> as id -200. The tower is convolutional and downsamples by 64: 64-pixel pictures (its
# processor reads size and crop_size from preprocessor_config.json) make one image token, ~2.5 s a picture here
# (in bfloat16 its convolutions run slower on this CPU, ~3.4 s, so float32: a 478 MB folder). Its matrices scaled by
# 2.5: at 1 two pictures give equal features, at 2 they barely differ, at 3 they reach 1e7, at 4 1e22.

def _fastvlm(m, ids, vocab):
    return {"model_type": "llava_qwen2", "text_config": shrink(m.TextConfig, model_type="qwen2", vocab_size=vocab),
            "vision_config": {}, "mm_projector_type": "mlp2x_gelu", "eos_token_id": ids["<|im_end|>"]}


_add("fastvlm", Recipe(specials=["<|endoftext|>", "<|im_end|>", "<image>"], eos="<|im_end|>",
                       template=LLAVA_TEMPLATE, config=_fastvlm, scaled={"vision_tower.": 2.5},
                       files={"preprocessor_config.json": {"size": {"shortest_edge": 64},
                                                           "crop_size": {"height": 64, "width": 64}}}))


# ---- Phi-3-Vision (phi3_v): the CLIP ViT-L/14 tower at 336 pixels (24 layers, 1024 wide, ~303 M parameters; a class
# attribute of its VisionModel, the config's vision part not read), four neighbouring patch features concatenated and
# projected by a 2-layer GELU MLP, its own Phi-3 text model (sizes at the config's top level). Its processor
# (Phi3VProcessor) tiles a picture into 336-pixel crops, at most num_crops (preprocessor_config.json; 1 here, the
# least: one tile and the global view, 313 image tokens) and writes each image's tokens as -1 at <|image_1|>,
# the tag mlx-vlm's prompt writes before the question. ~18 s a picture here in float32 with OpenBLAS (bfloat16 ~200 s:
# its matmuls have no fast path on this CPU), so float32; a folder of 1.2 GB.

PHI3_TEMPLATE = _turns("{{ '<|' + message['role'] + '|>\\n' }}", "<|image_1|>", "<|end|>\\n", "<|assistant|>\\n")


def _phi3_v(m, ids, vocab):
    return {"model_type": "phi3_v", **shrink(m.ModelConfig, vocab_size=vocab), "vision_config": {},
            "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|end|>"]}


_add("phi3_v", Recipe(specials=["<|endoftext|>", "<|user|>", "<|assistant|>", "<|end|>"], eos="<|end|>",
                      template=PHI3_TEMPLATE, config=_phi3_v,
                      files={"preprocessor_config.json": {"num_crops": 1, "num_img_tokens": 144}}))


# ---- Gemma 3n (gemma3n): the MobileNet-V5 tower (294.1 M parameters, fixed in gemma3n_mobilenet_def) at its smallest
# picture, 256 pixels: 16x16 = 256 soft tokens of its 2048 channels; Gemma 3n's text model (AltUp, LAuReL, per-layer
# inputs) tiny. Its embedding step reads a token as the vision embedder's from vision_config.vocab_offset and as the
# audio embedder's from audio_config.vocab_offset (262144 and 262272 in its checkpoints): here 512 and 640, the image
# and audio tokens placed just past them, the text's per-layer inputs below 512. Its processor expands
# each image token of the prompt (its template writes one an image) into image_seq_length of them framed by the
# tokenizer's named begin and end tokens.

_G3N_VISION, _G3N_AUDIO = 512, 640
G3N_TEMPLATE = _turns("{{ '<start_of_turn>' + message['role'] + '\\n' }}", "<image_soft_token>", "<end_of_turn>\\n",
                      "<start_of_turn>model\\n")


def _gemma3n(m, ids, vocab):
    text = shrink(m.TextConfig, model_type="gemma3n_text", vocab_size=vocab, vocab_size_per_layer_input=_G3N_VISION,
                  hidden_size_per_layer_input=8, laurel_rank=8, layer_types=["sliding_attention", "full_attention"],
                  sliding_window=16, num_kv_shared_layers=0, activation_sparsity_pattern=[0.0, 0.0],
                  altup_num_inputs=2, altup_coef_clip=120.0, query_pre_attn_scalar=16,
                  intermediate_size=[2 * WIDTH] * 2)
    return {"model_type": "gemma3n", "text_config": text,
            "vision_config": {"model_type": "gemma3n_vision", "hidden_size": 2048, "vocab_size": 128,
                              "vocab_offset": _G3N_VISION},
            "audio_config": shrink(m.AudioConfig, hidden_size=WIDTH, conf_num_hidden_layers=1,
                                   conf_num_attention_heads=2, sscp_conv_channel_size=[4, 4], vocab_size=2,
                                   vocab_offset=_G3N_AUDIO),
            "image_token_id": ids["<image_soft_token>"], "audio_token_id": ids["<audio_soft_token>"],
            "vision_soft_tokens_per_image": 256, "vocab_size": vocab, "hidden_size": WIDTH,
            "eos_token_id": [ids["<end_of_turn>"]], "pad_token_id": ids["<pad>"]}


_add("gemma3n", Recipe(
    specials=["<pad>", "<end_of_turn>", "<start_of_turn>", "<start_of_image>", "<end_of_image>", "<start_of_audio>",
              "<end_of_audio>", "<image_soft_token>", "<audio_soft_token>"],
    eos="<end_of_turn>", template=G3N_TEMPLATE, config=_gemma3n, unscaled=("embed_tokens",),
    fixed={"<image_soft_token>": _G3N_VISION + 1, "<audio_soft_token>": _G3N_AUDIO + 1},
    tokenizer_config={"extra_special_tokens": {
        "image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
        "audio_token": "<audio_soft_token>", "boa_token": "<start_of_audio>", "eoa_token": "<end_of_audio>"}},
    files={"preprocessor_config.json": {
        "image_processor_type": "SiglipImageProcessor", "processor_class": "Gemma3nProcessor",
        "size": {"height": 256, "width": 256}, "do_resize": True, "do_rescale": True, "do_normalize": False,
        "do_convert_rgb": True, "resample": 2},
        "processor_config.json": {"processor_class": "Gemma3nProcessor", "image_seq_length": 256}}))


# ---- The DeepSeek-OCR families: a SAM ViT-B tower built from SAMViTConfig()'s defaults, not the config (12 layers of
# width 768; 95.6M parameters), whose processor pads each picture's global view to 1024 pixels (base_size, a call
# argument left at its default by every caller): 64x64 patches, 16x16 after its neck. A linear projector takes what
# the towers make into a tiny DeepSeek-V2 text model. ~37 s a picture here in float32 with OpenBLAS.
# - DeepSeek-OCR (deepseekocr): SAM's neck goes out to 1024 channels, the patch embeddings of a CLIP part, whose width
#   stays 1024 (one layer here; patch size 14 at its fixed 224 pixels gives the 16x16 positions); the projector takes
#   both parts' 2048 channels. A picture of at most 640 pixels a side is the global view alone: 273 image tokens (16
#   rows of 16 and a newline, the view separator).
# - DeepSeek-OCR 2 (deepseekocr_2): SAM's neck goes out to 896 channels into a Qwen2 decoder used as an encoder, whose
#   size its config's from_dict fixes (24 layers of width 896, ~360M parameters) but for its width, which must be
#   SAM's 896. Its processor also cuts the picture into 768-pixel crops by its aspect ratio (at least one).
# - Unlimited-OCR (model_type unlimited-ocr, mlx-vlm's unlimited_ocr): DeepSeek-OCR's towers and processor over a
#   DeepSeek-V2 text model whose every layer keeps a ring of the last sliding_window positions (RingSlidingKVCache):
#   a window of 64 here, shorter than a prompt with a picture.

def _ocr(model_type: str, vision: dict, projected: int, **text) -> Recipe:
    def config(m, ids, vocab):
        return {"model_type": model_type,
                "text_config": shrink(m.TextConfig, model_type="deepseek_v2", vocab_size=vocab, **text),
                "vision_config": vision,
                "projector_config": {"projector_type": "linear", "input_dim": projected, "n_embed": WIDTH},
                "image_token_index": ids["<image>"], "pad_id": ids["<｜▁pad▁｜>"], "vocab_size": vocab,
                "eos_token_id": [ids["<｜end▁of▁sentence｜>"]]}

    return Recipe(specials=DEEPSEEK_SPECIALS, eos="<｜end▁of▁sentence｜>", template=DEEPSEEK_TEMPLATE, config=config,
                  named={"bos_token": "<｜begin▁of▁sentence｜>"},
                  files={"processor_config.json": {"candidate_resolutions": [[1024, 1024]], "patch_size": 16,
                                                   "downsample_ratio": 4, "image_token": "<image>",
                                                   "pad_token": "<｜▁pad▁｜>"}})


_OCR_CLIP = {"model_type": "vision", "layers": 1, "width": 1024, "hidden_size": 1024, "intermediate_size": 64,
             "num_attention_heads": 2, "patch_size": 14}
_add("deepseekocr", _ocr("deepseekocr", _OCR_CLIP, 2048))
_add("deepseekocr_2", _ocr("deepseekocr_2", {"model_type": "vision", "width": {"qwen2-0-5b": {"dim": 896}}}, 896))
_add("unlimited_ocr", _ocr("unlimited-ocr", _OCR_CLIP, 2048, sliding_window=64, sliding_window_size=64))
