"""Recipes: Omni families (image, video and audio parts): nemotron_h_nano_omni, mimo_v2, inkling. Images only here, as
audio is not served; muse_spark, the fourth of the group, cannot run on the CPU (vision_families.LIBRARY_CANNOT).
"""

from zoo.recipes.base import CLIP_MEAN, CLIP_STD, QWEN, Recipe, _add, _qwen_ids, _qwen_preprocessor, _turns
from zoo.vision_shrink import TEXT, WIDTH, shrink


# ---- Nemotron 3 Nano Omni: a RADIO tower (patches of 16, a class token), pixel shuffle, a Nemotron-H hybrid
# (Mamba 2 and attention) text model; its processor expands each <image> to <img><image>...</img>, one <image> a
# merged 2x2 of patches, the count chosen by its patch budget (min/max_num_patches). No sound_config: no audio.

NEMOTRON_OMNI_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<img>", "</img>", "<image>", "<video>",
                          "<so_embedding>"]
# The position table: 8x8 patches (its default, 2048 pixels, is 128x128 of them: 2 MB), interpolated for other
# grids; the processor's budget (max_num_patches) keeps an image to 64 patches.
_RADIO_PATCH, _RADIO_GRID = 16, 8


def _nemotron_h_nano_omni(m, ids, vocab):
    # The Mamba 2 sizes nemotron_h has no generic shrink for: 4 heads of 16 (2 x hidden), one group.
    text = shrink(m.TextConfig, TEXT, model_type="nemotron_h", vocab_size=vocab, hybrid_override_pattern=["M", "*"],
                  mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=8, conv_kernel=4, n_groups=1,
                  attention_bias=False, mamba_proj_bias=False, mlp_bias=False, use_bias=False, use_conv_bias=True,
                  layer_norm_epsilon=1e-5)
    vision = shrink(m.VisionConfig, model_type="radio", patch_size=_RADIO_PATCH, image_size=_RADIO_PATCH * _RADIO_GRID,
                    max_resolution=_RADIO_PATCH * _RADIO_GRID)
    return {"model_type": "nemotron_h_nano_omni", "text_config": text, "vision_config": vision,
            "downsample_ratio": 0.5, "vit_hidden_size": WIDTH, "projector_hidden_size": WIDTH,
            "img_context_token_id": ids["<image>"], "video_context_token_id": ids["<video>"],
            "vocab_size": vocab, "eos_token_id": ids["<|im_end|>"]}


_add("nemotron_h_nano_omni", Recipe(
    specials=NEMOTRON_OMNI_SPECIALS, eos="<|im_end|>", config=_nemotron_h_nano_omni,
    template=_turns("{{ '<|im_start|>' + message['role'] + '\\n' }}", "<image>\\n", "<|im_end|>\\n",
                    "<|im_start|>assistant\\n", video="<video>\\n"),
    files={"preprocessor_config.json": {"norm_mean": CLIP_MEAN, "norm_std": CLIP_STD, "patch_size": _RADIO_PATCH,
                                        "downsample_ratio": 0.5, "min_num_patches": 16,
                                        "max_num_patches": _RADIO_GRID ** 2, "max_model_len": 4096,
                                        "video_target_num_patches": 16},
           "processor_config.json": {"video_temporal_patch_dim": 2}}))


# ---- MiMo-V2: a Qwen-VL-like tower (patches of 16 with attention sinks), the Qwen 2.5-VL processor, a MiMo-V2-Flash
# text model (sliding-window and full attention layers, MoE) with its parameters at the top level, as its
# checkpoints have them. Its audio encoder is always built (20 code embeddings of 1280 x 1024 by default): shrunk.

def _mimo_v2(m, ids, vocab):
    text = shrink(m.TextConfig, model_type="mimo_v2", vocab_size=vocab, v_head_dim=16, swa_head_dim=16,
                  swa_v_head_dim=16, swa_num_attention_heads=2, swa_num_key_value_heads=1,
                  partial_rotary_factor=0.5,  # a whole number of rotated dims (its 0.334 of 16 is not)
                  hybrid_layer_pattern=[1, 0], moe_layer_freq=[0, 1])
    audio = {"out_hidden_size": WIDTH, "audio_channels": 2, "group_size": 4, "input_local_attn_heads": 2,
             "input_local_dim": WIDTH, "input_local_head_dim": 16, "input_local_intermediate_size": 2 * WIDTH,
             "input_local_layers": 1, "speech_vocab_size": 16, "speech_zeroemb_idx": 15}
    vision = shrink(m.VisionConfig, model_type="mimovl", num_key_value_heads=1, qk_channels=16, patch_size=16,
                    spatial_patch_size=16, fullatt_block_indexes=[])  # its one block windowed, with sinks
    return {**text, "vision_config": vision, "audio_config": audio, **_qwen_ids(ids)}


_add("mimo_v2", Recipe(**QWEN, config=_mimo_v2, files={"preprocessor_config.json": _qwen_preprocessor(16)}))


# ---- Inkling: an attention-free tower (hierarchical MLPs folding each 40-pixel tile, both temporal slots, into one
# soft token), a text model with short convolutions on k and v, learned relative-position logits, sliding and
# global layers, a dense then a sigmoid-routed MoE layer. Its processor always cuts 40-pixel tiles (its
# InklingImageProcessor is built with no arguments) and reads only the tokens from processor_config.json; it
# imports mlx-audio (an mlx-vlm dependency, no torch) for its audio features even when only images come.

INKLING_SPECIALS = ["<|pad|>", "<|end|>", "<|user|>", "<|assistant|>", "<|content_image|>", "<|image|>",
                    "<|content_audio_input|>", "<|audio|>"]


def _inkling(m, ids, vocab):
    text = shrink(m.TextConfig, model_type="inkling", vocab_size=vocab, swa_num_attention_heads=2,
                  swa_num_key_value_heads=1, swa_head_dim=16, sliding_window_size=16, rel_extent=64, d_rel=4,
                  layer_types=["hybrid_sliding", "full_attention"], mlp_layer_types=["dense", "sparse"],
                  dense_intermediate_size=2 * WIDTH, intermediate_size=WIDTH, n_shared_experts=1)
    # One layer: the tile's 2 x 40 x 40 x 3 values straight to a token (more layers fold through 4800 channels).
    vision = {"model_type": "inkling_vision", "patch_size": 40, "temporal_patch_size": 2, "n_layers": 1}
    return {"model_type": "inkling", "text_config": text, "vision_config": vision,
            "audio_config": {"model_type": "inkling_audio"}, "image_token_id": ids["<|image|>"],
            "audio_token_id": ids["<|audio|>"], "vocab_size": vocab, "eos_token_id": [ids["<|end|>"]]}


_add("inkling", Recipe(
    specials=INKLING_SPECIALS, eos="<|end|>", config=_inkling,
    template=_turns("{{ '<|' + message['role'] + '|>' }}", "<|content_image|><|image|>", "<|end|>",
                    "<|assistant|>", audio="<|content_audio_input|><|audio|>"),
    files={"processor_config.json": {"image_token": "<|image|>", "image_bos_token": "<|content_image|>",
                                     "audio_token": "<|audio|>", "audio_bos_token": "<|content_audio_input|>"}}))
