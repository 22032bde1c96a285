"""Recipes of families with tiles, resamplers or processors of their own: Idefics2, LLaVA-NeXT,
Llama 3.2 Vision, GLM-OCR, PaddleOCR-VL, LLaVA-OneVision, Aya Vision, Mage-VL, LFM2-VL, Granite Vision,
Bunny, Kimi K2.5, Phi-4 multimodal, DeepSeek-VL2, Janus, GOT-OCR 2.0, Granite 4 Vision, ERNIE 4.5 VL,
PLaMo 2 VL.
"""

import json

from zoo.recipes.base import CLIP_MEAN, CLIP_STD, QWEN, RECIPES, Recipe, _add, _qwen_ids, _qwen_preprocessor, _turns
from zoo.recipes.single_run import (
    GLM_FILES, GLM_SPECIALS, GLM_TEMPLATE, IDEFICS3_TEMPLATE, INTERN_TEMPLATE, KIMI_SPECIALS, LLAVA_TEMPLATE,
    _glm_eos, _glm_shared, _kimi, _llava
)
from zoo.vision_shrink import TEXT, WIDTH, shrink


# ---- Idefics2: SigLIP-like tower, a perceiver resampler to a fixed number of latents, a Mistral text model

def _idefics2(m, ids, vocab):
    return {"model_type": "idefics2", "architectures": ["Idefics2ForConditionalGeneration"],
            "text_config": shrink(m.TextConfig, model_type="mistral", vocab_size=vocab),
            "vision_config": shrink(m.VisionConfig, model_type="idefics2", patch_size=14, image_size=56),
            "perceiver_config": {"model_type": "idefics2Perceiver", "num_key_value_heads": 1, "resampler_depth": 1,
                                 "resampler_head_dim": 16, "resampler_n_heads": 2, "resampler_n_latents": 4},
            "image_token_id": ids["<image>"], "vocab_size": vocab, "eos_token_id": [ids["<end_of_utterance>"]]}


_add("idefics2", Recipe(
    specials=["<|endoftext|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>"],
    eos="<end_of_utterance>", template=IDEFICS3_TEMPLATE, config=_idefics2,
    files={"preprocessor_config.json": {
        "image_processor_type": "Idefics2ImageProcessor", "processor_class": "Idefics2Processor", "do_resize": True,
        "size": {"shortest_edge": 56, "longest_edge": 56}, "do_image_splitting": False, "do_rescale": True,
        "do_normalize": True, "do_convert_rgb": True, "do_pad": True, "image_mean": [0.5] * 3,
        "image_std": [0.5] * 3, "resample": 2},
        "processor_config.json": {"processor_class": "Idefics2Processor", "image_seq_len": 4}}))


# ---- LLaVA-NeXT: LLaVA with any-resolution tiles

def _llava_next(m, ids, vocab):
    return {**_llava(m, ids, vocab), "model_type": "llava_next", "architectures": ["LlavaNextForConditionalGeneration"],
            "image_grid_pinpoints": [[56, 56], [56, 112], [112, 56]]}


_add("llava_next", Recipe(
    specials=["<|endoftext|>", "<|im_end|>", "<image>"], eos="<|im_end|>", template=LLAVA_TEMPLATE,
    config=_llava_next,
    files={"preprocessor_config.json": {
        "image_processor_type": "LlavaNextImageProcessor", "processor_class": "LlavaNextProcessor",
        "size": {"shortest_edge": 56}, "crop_size": {"height": 56, "width": 56},
        "image_grid_pinpoints": [[56, 56], [56, 112], [112, 56]], "do_resize": True, "do_center_crop": True,
        "do_rescale": True, "do_normalize": True, "do_convert_rgb": True, "do_pad": True, "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD, "resample": 3},
        "processor_config.json": {"processor_class": "LlavaNextProcessor", "patch_size": 14, "image_token": "<image>",
                                  "vision_feature_select_strategy": "default", "num_additional_image_tokens": 1}}))


# ---- Llama 3.2 Vision (mllama): tiled images, text layers cross-attending to the image

MLLAMA_SPECIALS = ["<|finetune_right_pad_id|>", "<|eot_id|>", "<|begin_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|image|>"]


def _mllama(m, ids, vocab):
    # Up to 4 tiles of 2 x 2 patches (the library's default tiling, on 28-pixel tiles).
    vision = dict(image_size=28, patch_size=14, hidden_size=WIDTH, intermediate_size=2 * WIDTH, num_hidden_layers=2,
                  num_attention_heads=2, num_global_layers=1, intermediate_layers_indices=[0],
                  vision_output_dim=2 * WIDTH)
    return {"model_type": "mllama", "architectures": ["MllamaForConditionalGeneration"],
            "text_config": shrink(m.TextConfig, model_type="mllama", vocab_size=vocab, cross_attention_layers=[1],
                                  num_hidden_layers=3),
            "vision_config": vision, "image_token_index": ids["<|image|>"], "vocab_size": vocab,
            "eos_token_id": [ids["<|eot_id|>"]]}


_add("mllama", Recipe(
    specials=MLLAMA_SPECIALS, eos="<|eot_id|>", config=_mllama, named={"bos_token": "<|begin_of_text|>"},
    template=_turns("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}", "<|image|>",
                    "<|eot_id|>", "<|start_header_id|>assistant<|end_header_id|>\\n\\n", start="{{ bos_token }}"),
    files={"preprocessor_config.json": {
        "image_processor_type": "MllamaImageProcessor", "processor_class": "MllamaProcessor",
        "size": {"height": 28, "width": 28}, "max_image_tiles": 4, "do_resize": True, "do_rescale": True,
        "do_normalize": True, "do_convert_rgb": True, "do_pad": True, "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD, "resample": 2}}))


# ---- GLM-OCR: the GLM-4V layout, its own token names

def _glm_ocr(m, ids, vocab):
    return {"model_type": "glm_ocr",
            "text_config": shrink(m.TextConfig, model_type="glm_ocr_text", vocab_size=vocab, num_nextn_predict_layers=0,
                                  rope_parameters={"rope_type": "default", "mrope_section": [4, 2, 2],
                                                   "rope_theta": 10000.0, "partial_rotary_factor": 1.0},
                                  eos_token_id=_glm_eos(ids), pad_token_id=ids["<|endoftext|>"], dtype="float32"),
            **_glm_shared(m, "glm_ocr_vision", ids, vocab),
            "image_start_token_id": ids["<|begin_of_image|>"], "image_end_token_id": ids["<|end_of_image|>"],
            "video_start_token_id": ids["<|begin_of_video|>"], "video_end_token_id": ids["<|end_of_video|>"]}


_add("glm_ocr", Recipe(specials=GLM_SPECIALS, eos="<|endoftext|>", template=GLM_TEMPLATE, config=_glm_ocr,
                       files={"preprocessor_config.json": {**GLM_FILES["preprocessor_config.json"],
                                                           "min_pixels": 4 * 28 * 28, "max_pixels": 64 * 28 * 28}}))


# ---- PaddleOCR-VL: a NaViT-style tower, Qwen-like positions, an ERNIE text model

PADDLE_SPECIALS = ["<|endoftext|>", "<|end_of_sentence|>", "<|IMAGE_START|>", "<|IMAGE_END|>", "<|IMAGE_PLACEHOLDER|>",
                   "<|VIDEO_PLACEHOLDER|>", "User:", "Assistant:"]


def _paddle(m, ids, vocab):
    # Text parameters at the top level, where its config reads them; 1024 wide, the width its
    # vision projector writes whatever the config says (narrow heads and MLP keep it small).
    return {**shrink(m.TextConfig, model_type="paddleocr_vl", vocab_size=vocab, head_dim=16, use_bias=False,
                     hidden_size=1024,
                     hidden_act="silu", rope_scaling={"type": "default", "mrope_section": [4, 2, 2]},
                     pad_token_id=ids["<|endoftext|>"], bos_token_id=ids["<|endoftext|>"]),
            "vision_config": shrink(m.VisionConfig, model_type="paddleocr_vl", patch_size=14, image_size=56),
            "image_token_id": ids["<|IMAGE_PLACEHOLDER|>"], "video_token_id": ids["<|VIDEO_PLACEHOLDER|>"],
            "vision_start_token_id": ids["<|IMAGE_START|>"], "vision_end_token_id": ids["<|IMAGE_END|>"],
            "vocab_size": vocab, "eos_token_id": ids["<|end_of_sentence|>"]}


_add("paddleocr_vl", Recipe(
    specials=PADDLE_SPECIALS, eos="<|end_of_sentence|>", config=_paddle,
    template=_turns("{{ message['role'].capitalize() + ': ' }}",
                    "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>", "\\n", "Assistant: "),
    files={"preprocessor_config.json": {"min_pixels": 4 * 28 * 28, "max_pixels": 64 * 28 * 28, "patch_size": 14,
                                        "temporal_patch_size": 1, "merge_size": 2, "image_mean": [0.5] * 3,
                                        "image_std": [0.5] * 3, "do_resize": True, "do_rescale": True,
                                        "do_normalize": True, "do_convert_rgb": True}}))


# ---- LLaVA-OneVision: SigLIP tower, a Qwen2 text model, any-resolution tiles

def _llava_onevision(m, ids, vocab):
    return {"model_type": "llava_onevision", "architectures": ["LlavaOnevisionForConditionalGeneration"],
            "text_config": shrink(m.TextConfig, model_type="qwen2", vocab_size=vocab),
            "vision_config": shrink(m.VisionConfig, model_type="siglip_vision_model", image_size=56, patch_size=14),
            "image_token_index": ids["<image>"], "video_token_index": ids["<video>"],
            "image_grid_pinpoints": [[56, 56], [56, 112], [112, 56]], "vision_aspect_ratio": "anyres_max_9",
            "vocab_size": vocab, "eos_token_id": ids["<|im_end|>"]}


_add("llava_onevision", Recipe(
    specials=["<|endoftext|>", "<|im_end|>", "<image>", "<video>"], eos="<|im_end|>", template=LLAVA_TEMPLATE,
    config=_llava_onevision,
    files={"preprocessor_config.json": {
        "image_processor_type": "LlavaOnevisionImageProcessor", "processor_class": "LlavaOnevisionProcessor",
        "size": {"height": 56, "width": 56}, "image_grid_pinpoints": [[56, 56], [56, 112], [112, 56]],
        "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True, "do_pad": True,
        "image_mean": [0.5] * 3, "image_std": [0.5] * 3, "resample": 3},
        "processor_config.json": {"processor_class": "LlavaOnevisionProcessor", "num_image_tokens": 16,
                                  "image_token": "<image>", "video_token": "<video>",
                                  "vision_feature_select_strategy": "full"}}))


# ---- Aya Vision: SigLIP tower, pixel shuffle, a Cohere 2 text model, tiled images

AYA_SPECIALS = ["<PAD>", "<|END_OF_TURN_TOKEN|>", "<image>", "<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_PATCH|>",
                "<|IMG_LINE_BREAK|>", "<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>"]


def _aya(m, ids, vocab):
    return {"model_type": "aya_vision", "architectures": ["AyaVisionForConditionalGeneration"],
            "text_config": shrink(m.TextConfig, model_type="cohere2", vocab_size=vocab, sliding_window=4096,
                                  sliding_window_pattern=2, eos_token_id=ids["<|END_OF_TURN_TOKEN|>"],
                                  pad_token_id=ids["<PAD>"], bos_token_id=ids["<PAD>"]),
            "vision_config": shrink(m.VisionConfig, model_type="siglip_vision_model", image_size=56, patch_size=14),
            "image_token_index": ids["<|IMG_PATCH|>"], "downsample_factor": 2, "alignment_intermediate_size": WIDTH,
            "max_splits_per_img": 2, "vocab_size": vocab, "eos_token_id": ids["<|END_OF_TURN_TOKEN|>"]}


_add("aya_vision", Recipe(
    specials=AYA_SPECIALS, eos="<|END_OF_TURN_TOKEN|>", config=_aya,
    template=_turns("{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' }}", "<image>", "<|END_OF_TURN_TOKEN|>",
                    "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
    files={"preprocessor_config.json": {
        "image_processor_type": "GotOcr2ImageProcessor", "processor_class": "AyaVisionProcessor",
        "size": {"height": 56, "width": 56}, "crop_to_patches": True, "min_patches": 1, "max_patches": 2,
        "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True,
        "image_mean": [0.5] * 3, "image_std": [0.5] * 3, "resample": 3},
        "processor_config.json": {"processor_class": "AyaVisionProcessor", "patch_size": 14, "img_size": 56,
                                  "downsample_factor": 2, "image_token": "<image>"}}))


# ---- Mage-VL: the Qwen-VL tokens and image processor (patches of 16, one frame), a Qwen3 text model

def _mage_vl(m, ids, vocab):
    return {"model_type": "mage_vl", "text_config": shrink(m.TextConfig, model_type="qwen3", vocab_size=vocab),
            "vision_config": shrink(m.VisionConfig, model_type="mage_vl_vision", patch_size=16, image_size=64,
                                    text_hidden_size=WIDTH, num_attention_heads=1),  # 3-D rope: head 32 wide
            "vocab_size": vocab, **_qwen_ids(ids)}


_add("mage_vl", Recipe(**QWEN, config=_mage_vl,
                       files={"preprocessor_config.json": {**_qwen_preprocessor(16), "temporal_patch_size": 1}}))


# ---- LFM2-VL: a SigLIP 2 (NaFlex) tower, pixel unshuffle, an LFM2 text model (short convolutions and attention)

LFM2_SPECIALS = ["<|pad|>", "<|im_end|>", "<|im_start|>", "<image>", "<|image_start|>", "<|image_end|>",
                 "<|img_thumbnail|>"]
_LFM2_IMAGES = {"min_image_tokens": 4, "max_image_tokens": 16, "tile_size": 64, "encoder_patch_size": 16,
                "downsample_factor": 2, "max_num_patches": 64}


def _lfm2_vl(m, ids, vocab):
    text = shrink(m.TextConfig, model_type="lfm2", vocab_size=vocab, block_dim=WIDTH, block_ff_dim=2 * WIDTH,
                  conv_dim=WIDTH, conv_dim_out=WIDTH, num_heads=2, block_auto_adjust_ff_dim=False,
                  layer_types=["conv", "full_attention"], eos_token_id=ids["<|im_end|>"])
    vision = shrink(m.VisionConfig, model_type="siglip2_vision_model", patch_size=16, num_patches=64)
    return {"model_type": "lfm2-vl", "text_config": text, "vision_config": vision, "vocab_size": vocab,
            "image_token_id": ids["<image>"], "projector_hidden_size": WIDTH, "eos_token_id": ids["<|im_end|>"],
            **_LFM2_IMAGES}


# Scaled 1.5x, not 4x: larger, its attention saturates and the image no longer reaches the text.
_add("lfm2_vl", Recipe(
    specials=LFM2_SPECIALS, eos="<|im_end|>", config=_lfm2_vl, scale=1.5,
    template=INTERN_TEMPLATE.replace("<image>\\n", "<image>"),  # ChatML, the image before the text
    files={"preprocessor_config.json": {"image_processor_type": "Lfm2VlImageProcessor",
                                        "processor_class": "Lfm2VlProcessor", "image_mean": [0.5] * 3,
                                        "image_std": [0.5] * 3, "do_rescale": True, "do_normalize": True,
                                        "do_pad": True, "resample": 2, **_LFM2_IMAGES}}))


# ---- Granite Vision: LLaVA-NeXT's tiles on a SigLIP tower, a Granite text model

def _granite_vision(m, ids, vocab):
    return {"model_type": "granite_vision",
            "text_config": shrink(m.TextConfig, model_type="granite", vocab_size=vocab,
                                  # plain scales (a checkpoint's 12x embeddings and 0.22x residuals
                                  # drown a random tower's image)
                                  embedding_multiplier=1.0, residual_multiplier=1.0, attention_multiplier=0.25,
                                  logits_scaling=1.0),
            "vision_config": shrink(m.VisionConfig, model_type="siglip_vision_model", image_size=56, patch_size=14),
            "image_token_index": ids["<image>"], "vision_feature_select_strategy": "full",
            "vision_feature_layer": -1, "image_grid_pinpoints": [[56, 56], [56, 112], [112, 56]],
            "vocab_size": vocab, "eos_token_id": [ids["<|im_end|>"]]}


_LLAVA_NEXT = RECIPES["llava_next"]
_add("granite_vision", Recipe(
    specials=_LLAVA_NEXT.specials, eos="<|im_end|>", template=LLAVA_TEMPLATE, config=_granite_vision,
    files={"preprocessor_config.json": {**_LLAVA_NEXT.files["preprocessor_config.json"], "image_mean": [0.5] * 3,
                                        "image_std": [0.5] * 3},
           "processor_config.json": {**_LLAVA_NEXT.files["processor_config.json"],
                                     "vision_feature_select_strategy": "full", "num_additional_image_tokens": 0}}))


# ---- Bunny (llava-qwen2): SigLIP at mlx-vlm's fixed 384 pixels, a Qwen2 text model, the image spliced in at
# <image> as id -200 (the text parameters at the top level, as its checkpoints have them)

def _llava_bunny(m, ids, vocab):
    return {**shrink(m.TextConfig, model_type="qwen2", vocab_size=vocab), "model_type": "llava-qwen2",
            "vision_config": shrink(m.VisionConfig, model_type="siglip_vision_model", image_size=384, patch_size=14),
            "auto_map": {}, "mm_hidden_size": WIDTH, "eos_token_id": [ids["<|im_end|>"]]}


_add("llava_bunny", Recipe(specials=["<|endoftext|>", "<|im_end|>", "<image>"], eos="<|im_end|>",
                           template=LLAVA_TEMPLATE, config=_llava_bunny))


# ---- Kimi K2.5: Kimi-VL's tokens and MoonViT (3-D patches), a DeepSeek-V3 text model, its own processor

def _kimi_k25(m, ids, vocab):
    return {**_kimi(m, ids, vocab), "model_type": "kimi_k25",
            "vision_config": shrink(m.VisionConfig, model_type="moonvit", patch_size=14, init_pos_emb_height=8,
                                    init_pos_emb_width=8, merge_kernel_size=[2, 2])}


_add("kimi_k25", Recipe(
    specials=KIMI_SPECIALS, eos="<|im_end|>", config=_kimi_k25, template=RECIPES["kimi_vl"].template,
    files={"preprocessor_config.json": {"media_proc_cfg": {"patch_size": 14, "in_patch_limit": 64,
                                                           "merge_kernel_size": [2, 2], "image_mean": [0.5] * 3,
                                                           "image_std": [0.5] * 3}}}))


# ---- Phi-4 multimodal: mlx-vlm's own NaFlex image processor on a SigLIP 2 tower, a Phi-4 text model (its
# parameters at the top level), a Conformer audio encoder (sized by audio_processor), the image at <image> as -200

def _phi4mm(m, ids, vocab):
    audio = {"attention_dim": WIDTH, "attention_heads": 2, "num_blocks": 1, "linear_units": 2 * WIDTH,
             "ext_pw_out_channel": WIDTH, "depthwise_seperable_out_channel": WIDTH, "conv_channels": WIDTH}
    return {**shrink(m.ModelConfig, TEXT), "model_type": "phi4mm", "vocab_size": vocab,
            "vision_config": shrink(m.VisionConfig, num_hidden_layers=2, patch_size=14, image_size=56),
            "mm_hidden_size": WIDTH, "min_num_patches": 4, "max_num_patches": 16,
            "audio_processor": {"config": audio}, "tie_word_embeddings": False,
            "eos_token_id": ids["<|end|>"], "pad_token_id": ids["<|endoftext|>"]}


_add("phi4mm", Recipe(specials=["<|endoftext|>", "<|end|>", "<|user|>", "<|assistant|>", "<image>"], eos="<|end|>",
                      template=_turns("{{ '<|' + message['role'] + '|>' }}", "<image>", "<|end|>", "<|assistant|>"),
                      config=_phi4mm))


# ---- DeepSeek-VL2: tiled SigLIP (a global view, then local tiles, 2x2 downsampled), a DeepSeek-V2 MoE text
# model; its own processor reads processor_config.json and adds its chat and grounding tokens itself

DEEPSEEK_SPECIALS = ["<｜▁pad▁｜>", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<image>", "<|User|>",
                     "<|Assistant|>"]
DEEPSEEK_TEMPLATE = _turns("{{ '<|' + message['role'].capitalize() + '|>: ' }}", "<image>\\n",
                           "\\n\\n", "<|Assistant|>:")
_DEEPSEEK_TILE = 32  # pixels of a tile: 4x4 patches of 8, 2x2 image tokens after the downsample


def _deepseek_vl_v2(m, ids, vocab):
    return {"model_type": "deepseek_vl_v2",
            "text_config": shrink(m.TextConfig, model_type="deepseek_v2", vocab_size=vocab),
            "vision_config": {"model_type": "vision", "layers": 1, "width": WIDTH, "num_attention_heads": 2,
                              "mlp_ratio": 2.0, "image_size": _DEEPSEEK_TILE, "patch_size": 8},
            "projector_config": {"projector_type": "downsample_mlp_gelu", "input_dim": WIDTH, "n_embed": WIDTH,
                                 "depth": 2, "downsample_ratio": 2},
            "image_token_index": ids["<image>"], "pad_id": ids["<｜▁pad▁｜>"], "vocab_size": vocab,
            "eos_token_id": [ids["<｜end▁of▁sentence｜>"]]}


_add("deepseek_vl_v2", Recipe(
    specials=DEEPSEEK_SPECIALS, eos="<｜end▁of▁sentence｜>", template=DEEPSEEK_TEMPLATE, config=_deepseek_vl_v2,
    named={"bos_token": "<｜begin▁of▁sentence｜>"},
    # One tile, two side by side, two stacked (the first is the tile's size): the test's landscape and portrait
    # pictures take different prompt lengths.
    files={"processor_config.json": {"candidate_resolutions": [[_DEEPSEEK_TILE, _DEEPSEEK_TILE],
                                                               [2 * _DEEPSEEK_TILE, _DEEPSEEK_TILE],
                                                               [_DEEPSEEK_TILE, 2 * _DEEPSEEK_TILE]], "patch_size": 8,
                                     "downsample_ratio": 2, "image_token": "<image>", "pad_token": "<｜▁pad▁｜>"}}))


# ---- Janus / DeepSeek-VL (multi_modality): a SigLIP tower (the plain one; the hybrid SAM+SigLIP tower is the
# other choice), an MLP aligner, a Llama text model. The processor repeats <image> num_image_tokens times and the
# model splices the features over that run, so both counts are the tower's patches.

_JANUS_SIZE, _JANUS_PATCH = 32, 8


def _multi_modality(m, ids, vocab):
    return {"model_type": "multi_modality",
            "text_config": shrink(m.TextConfig, model_type="llama", vocab_size=vocab),
            "vision_config": shrink(m.VisionConfig, model_type="vision", cls="CLIPVisionTower",
                                    # the image processor reads its size only from here (else 384 pixels)
                                    params={"high_res_cfg": {"image_size": _JANUS_SIZE, "pixel_mean": [0.5] * 3,
                                                             "pixel_std": [0.5] * 3}},
                                    image_size=_JANUS_SIZE, patch_size=_JANUS_PATCH),
            "aligner_config": {"cls": "MlpProjector", "model_type": "aligner",
                               "params": {"projector_type": "mlp_gelu", "depth": 2}},
            "image_token_index": ids["<image>"], "pad_id": ids["<｜▁pad▁｜>"], "vocab_size": vocab,
            "num_image_tokens": (_JANUS_SIZE // _JANUS_PATCH) ** 2, "eos_token_id": [ids["<｜end▁of▁sentence｜>"]]}


_add("multi_modality", Recipe(
    specials=DEEPSEEK_SPECIALS, eos="<｜end▁of▁sentence｜>", template=DEEPSEEK_TEMPLATE, config=_multi_modality,
    named={"bos_token": "<｜begin▁of▁sentence｜>"},
    files={"processor_config.json": {"processor_class": "MultiModalityProcessor",
                                     "num_image_tokens": (_JANUS_SIZE // _JANUS_PATCH) ** 2}}))


# ---- GOT-OCR 2.0: a SAM-like tower (its image processor always resizes to 1024 pixels; two stride-2 convolutions
# make the 64x64 patch grid the fixed 256 <imgpad> its prompt holds), a Qwen2 text model, the config flat. Like the
# real checkpoints, no chat template: mlx-vlm then prompts with the bare question and the processor wraps it in
# GOT's own conversation with the image's tokens (a templated prompt it leaves as it is, without them).

GOT_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<img>", "</img>", "<imgpad>", "<image>"]


def _got(m, ids, vocab):
    return {**shrink(m.TextConfig, model_type="qwen2", vocab_size=vocab), "model_type": "got",
            "vision_config": shrink(m.VisionConfig, model_type="got", depth=1, embed_dim=WIDTH, num_heads=2,
                                    mlp_ratio=2.0, out_chans=16, out_dim=WIDTH, global_attn_indexes=[]),
            "im_patch_token": ids["<imgpad>"], "im_start_token": ids["<img>"], "im_end_token": ids["</img>"],
            "vocab_size": vocab, "eos_token_id": [ids["<|im_end|>"]]}


_add("got", Recipe(specials=GOT_SPECIALS, eos="<|im_end|>", config=_got, template=None))


# ---- Granite 4 Vision: LLaVA-NeXT's tiles on a SigLIP tower, windowed Q-Former projectors (one per deepstack
# layer, four spatial ones) whose features are added at chosen text layers, a Granite text model. The Q-Former's
# heads are its width over 64, so the tower is 64 wide.

def _granite4_vision(m, ids, vocab):
    return {"model_type": "granite4_vision",
            "text_config": shrink(m.TextConfig, model_type="granite", vocab_size=vocab,
                                  embedding_multiplier=1.0, residual_multiplier=1.0, attention_multiplier=0.25,
                                  logits_scaling=1.0),  # plain scales, as for Granite Vision
            "vision_config": shrink(m.VisionConfig, model_type="siglip_vision_model", image_size=56, patch_size=14,
                                    hidden_size=64, intermediate_size=64),
            "image_token_index": ids["<image>"], "vision_feature_select_strategy": "full",
            "image_grid_pinpoints": [[56, 56], [56, 112], [112, 56]], "downsample_rate": "1/2",
            "deepstack_layer_map": [[-1, 1]], "use_spatial_sampling": True, "spatial_target_layers": [0],
            "vocab_size": vocab, "eos_token_id": [ids["<|im_end|>"]]}


_add("granite4_vision", Recipe(
    specials=_LLAVA_NEXT.specials, eos="<|im_end|>", template=LLAVA_TEMPLATE, config=_granite4_vision,
    files={"preprocessor_config.json": RECIPES["granite_vision"].files["preprocessor_config.json"],
           "processor_config.json": {**RECIPES["granite_vision"].files["processor_config.json"],
                                     "downsample_rate": "1/2"}}))


# ---- ERNIE 4.5 VL: a DFN-RoPE tower (Qwen-like patches of 14, merged 2x2), a resampler, an ERNIE 4.5 MoE text
# model with 3-D RoPE; its tokenizer is a SentencePiece model (tokenizer.model), trained here on the same corpus.

ERNIE_SPECIALS = ["<|IMAGE_START|>", "<|IMAGE_END|>", "<|IMAGE_PLACEHOLDER|>", "<|image@placeholder|>",
                  "<|begin_of_sentence|>", "<|end_of_sentence|>", "<mask:1>", "<mask:7>"]
# mlx-vlm hands ERNIE its images as image_url parts
ERNIE_TEMPLATE = _turns("{{ message['role'].capitalize() + ': ' }}",
                        "<|IMAGE_START|><|image@placeholder|><|IMAGE_END|>", "\\n", "Assistant: ").replace(
    "part['type'] == 'image'", "part['type'] in ('image', 'image_url')")


def _ernie_tokenizer(target, recipe):
    import io

    import sentencepiece as spm
    from vision_fixture import CORPUS

    from mlx_vlm.models.ernie4_5_moe_vl.processing_ernie4_5_moe_vl import Ernie4_5_VLTokenizer

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS * 4), model_writer=model, vocab_size=400,
                                   model_type="bpe", byte_fallback=True, user_defined_symbols=ERNIE_SPECIALS,
                                   unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    target.mkdir(parents=True, exist_ok=True)
    (target / "tokenizer.model").write_bytes(model.getvalue())
    (target / "tokenizer_config.json").write_text(json.dumps({"chat_template": recipe.template}))
    return Ernie4_5_VLTokenizer(str(target / "tokenizer.model"), chat_template=recipe.template)


def _ernie(m, ids, vocab):
    text = shrink(m.TextConfig, vocab_size=vocab, head_dim=None, moe_num_experts=4, moe_layer_start_index=1,
                  moe_layer_end_index=1, moe_k=2, moe_intermediate_size=WIDTH, mrope_section=[3, 3, 2],
                  freq_allocation=2)
    text.pop("head_dim")
    patch = ids["<|IMAGE_PLACEHOLDER|>"]
    return {**text, "model_type": "ernie4_5_moe_vl",
            "vision_config": shrink(m.VisionConfig, depth=1, embed_dim=WIDTH, num_heads=2, mlp_ratio=2.0),
            "pixel_hidden_size": WIDTH, "im_patch_id": patch, "image_token_id": patch, "video_token_id": patch,
            "image_start_token_id": ids["<|IMAGE_START|>"], "image_end_token_id": ids["<|IMAGE_END|>"],
            "vocab_size": vocab, "eos_token_id": [ids["</s>"]]}


_add("ernie4_5_moe_vl", Recipe(specials=ERNIE_SPECIALS + ["</s>"], eos="</s>", template=ERNIE_TEMPLATE,
                               config=_ernie, tokenizer=_ernie_tokenizer))


# ---- PLaMo 2 VL: SigLIP tiles (no downsampling here: a tile's patches are its <plamo:image> tokens), a PLaMo 2
# hybrid (Mamba and attention) text model. Its processor writes the prompt itself (a fixed Japanese instruction
# template, the images' tokens first) and its tokenizer reads tokenizer.jsonl: rows [piece, score, kind], byte
# pieces for what no piece covers. The one written here holds the corpus's characters and words.

PLAMO_SPECIALS = ["<|plamo:unk|>", "<|plamo:bos|>", "<|plamo:eos|>", "<|plamo:pad|>", "<plamo:image>",
                  "<siglip2:img>", "</siglip2:img>"]
_PLAMO_TILE, _PLAMO_PATCH = 28, 14


def _plamo_tokenizer(target, recipe):
    from vision_fixture import CORPUS

    from mlx_vlm.models.plamo2vl.processing import Plamo2Tokenizer

    rows = [[t, 0.0, "CONTROL"] for t in PLAMO_SPECIALS] + [[f"<0x{b:02X}>", 0.0, "BYTE"] for b in range(256)]
    words = sorted({p for line in CORPUS for w in line.split() for p in (w, " " + w)} | set("".join(CORPUS)))
    rows += [[w, -1.0, "NORMAL"] for w in words]  # each piece costs the same: the fewest pieces win
    target.mkdir(parents=True, exist_ok=True)
    (target / "tokenizer.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    (target / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|plamo:eos|>", "bos_token": "<|plamo:bos|>", "pad_token": "<|plamo:pad|>",
         "unk_token": "<|plamo:unk|>", "additional_special_tokens": PLAMO_SPECIALS[4:]}))
    return Plamo2Tokenizer.from_pretrained(target)


def _plamo2vl(m, ids, vocab):
    return {"model_type": "plamo2vl",
            "text_config": shrink(m.TextConfig, model_type="plamo2", vocab_size=vocab, hidden_size_per_head=16,
                                  mamba_d_state=8, mamba_num_heads=2, mamba_step=2, mamba_chunk_size=16,
                                  attention_window_size=4096),
            "vision_config": shrink(m.VisionConfig, image_size=_PLAMO_TILE, patch_size=_PLAMO_PATCH,
                                    image_token_id=ids["<plamo:image>"], image_feature_size=WIDTH,
                                    image_proj_hidden_size=WIDTH),
            "image_token_index": ids["<plamo:image>"], "eos_token_id": [ids["<|plamo:eos|>"]]}


_add("plamo2vl", Recipe(
    specials=PLAMO_SPECIALS, eos="<|plamo:eos|>", template=None, config=_plamo2vl, tokenizer=_plamo_tokenizer,
    files={"preprocessor_config.json": {
        "image_processor_type": "SiglipImageProcessor", "size": {"height": _PLAMO_TILE, "width": _PLAMO_TILE},
        "do_resize": True, "do_rescale": True, "do_normalize": True, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
        "patch_size": _PLAMO_PATCH, "max_image_width": 2 * _PLAMO_TILE, "max_image_height": 2 * _PLAMO_TILE,
        "downsample_ratio": 1.0, "tile_context_length": 64}}))
