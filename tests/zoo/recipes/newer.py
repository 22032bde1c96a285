"""Recipes: Newer towers and text models: gemma4_unified, glm5_next, step3p7, minimax_m3_vl,
cohere_compass, muse_glimmer.
"""

from dataclasses import replace

from zoo.recipes.base import RECIPES, Recipe, _add, _turns
from zoo.recipes.single_run import GEMMA4_TURN, GLM_SPECIALS, GLM_TEMPLATE, _gemma4, _glm_eos
from zoo.recipes.tiled import AYA_SPECIALS
from zoo.vision_shrink import WIDTH, shrink


# ---- Gemma 4 unified: Gemma 4's tokens and text model, no vision tower (each 48-pixel patch is normed and
# projected straight into the text, with a learned 2-D position table). mlx-vlm's loader replaces the processor's
# image processor with a default one (16-pixel patches pooled 3x3, up to 280 soft tokens), whatever the
# checkpoint says: the model takes 48-pixel patches, and a picture here is some 270 image tokens.

def _gemma4_unified(m, ids, vocab):
    config = _gemma4(m, ids, vocab)
    # no per-layer inputs: the unified text config's default
    config["text_config"].update(model_type="gemma4_unified_text", hidden_size_per_layer_input=0)
    # a position table as long as the longest side a 280-token picture can have
    vision = shrink(m.VisionConfig, model_type="gemma4_unified_vision", patch_size=16, pooling_kernel_size=3,
                    model_patch_size=48, mm_embed_dim=WIDTH, mm_posemb_size=280, output_proj_dims=WIDTH)
    return {**config, "model_type": "gemma4_unified", "vision_config": vision, "vision_soft_tokens_per_image": 280}


# No audio tower either: a clip's frames are projected straight into the text (embed_audio), so its
# template renders a clip too, and that projection is scaled up (at the recipe's 8, a 4 s clip barely
# moved the text).
_add("gemma4_unified", replace(RECIPES["gemma4"], config=_gemma4_unified, scaled={"embed_audio": 16.0},
                               template=_turns(GEMMA4_TURN, "<|image|>", "<turn|>\\n", "<|turn>model\\n",
                                               start="{{ bos_token }}", video="<|video|>", audio="<|audio|>"),
                               # 70 soft tokens a frame (the fewest its video processor allows), 48-pixel patches
                               files={"processor_config.json": {"video_processor": {
                                   "patch_size": 16, "pooling_kernel_size": 3, "max_soft_tokens": 70,
                                   "num_frames": 2}}}))


# ---- GLM-5-Next: GLM-4V's tokens and template, a Qwen-like tower (patches of 14 merged 2x2), a GLM-5 text model
# (linear attention, then NoPE latent attention with a sparse top-k indexer; MoE; hyper-connections). mlx-vlm's
# loader puts a default image processor in place (at least 16 tokens a picture), so no processor file is needed.

def _glm5_next(m, ids, vocab):
    text = shrink(m.TextConfig, model_type="glm5_next_text", vocab_size=vocab, num_key_value_heads=2,
                  qk_rope_head_dim=0, qk_nope_head_dim=16, layer_types=["linear_attention", "full_attention"],
                  mlp_layer_types=["dense", "sparse"], index_n_heads=2, index_head_dim=16, index_kpool=8,
                  index_topk=16, linear_head_dim=16,  # two pools of 8 keys: a test prompt is sparse
                  linear_num_heads=2, eos_token_id=_glm_eos(ids), pad_token_id=ids["<|endoftext|>"])
    return {"model_type": "glm5_next", "text_config": text,
            "vision_config": shrink(m.VisionConfig, model_type="glm5_next_vision", projection_intermediate_size=64),
            "image_token_id": ids["<|image|>"], "video_token_id": ids["<|video|>"],
            "image_start_token_id": ids["<|begin_of_image|>"], "image_end_token_id": ids["<|end_of_image|>"],
            "video_start_token_id": ids["<|begin_of_video|>"], "video_end_token_id": ids["<|end_of_video|>"],
            "eos_token_id": _glm_eos(ids)}


_add("glm5_next", Recipe(specials=GLM_SPECIALS, eos="<|endoftext|>", template=GLM_TEMPLATE, config=_glm5_next))


# ---- Step 3.7: a Perception Encoder tower and two stride-2 convolutions, a Step 3.5 text model (sliding and full
# attention, MoE). Its processor fixes the picture at 728 pixels and 169 image tokens (13x13 after the two
# convolutions), so the tower's patches stay 14 pixels (52x52 of them: one head, its attention is most of a case's
# time). Pictures are padded square first; only those over 728 pixels add 504-pixel tiles (81 tokens each), which
# the test's small pictures do not reach.

STEP_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<im_patch>", "<patch_start>", "<patch_end>",
                 "<patch_newline>", "<im_start>", "<im_end>"]


def _step3p7(m, ids, vocab):
    text = shrink(m.TextConfig, model_type="step3p5", vocab_size=vocab, num_attention_groups=1, moe_num_experts=4,
                  moe_top_k=2, share_expert_dim=WIDTH, moe_layers_enum=[1], sliding_window=64,
                  layer_types=["sliding_attention", "full_attention"], pad_token_id=ids["<|endoftext|>"],
                  eos_token_id=ids["<|im_end|>"])
    vision = shrink(m.VisionConfig, width=WIDTH, layers=1, heads=1, mlp_ratio=2.0, image_size=728, patch_size=14)
    return {"model_type": "step3p7", "text_config": text, "vision_config": vision,
            "image_token_id": ids["<im_patch>"], "vocab_size": vocab, "eos_token_id": ids["<|im_end|>"]}


# mlx-vlm puts <im_patch> in the text of the user's turn
_add("step3p7", Recipe(specials=STEP_SPECIALS, eos="<|im_end|>", config=_step3p7,
                       template=_turns("{{ '<|im_start|>' + message['role'] + '\\n' }}", "<im_patch>",
                                       "<|im_end|>\\n", "<|im_start|>assistant\\n")))


# ---- MiniMax M3 VL: a CLIP tower with 3-D RoPE over Qwen-like patches (14 pixels, merged 2x2 by an MLP), a
# MiniMax-M3 text model (a dense and a MoE layer; the second with its block-sparse indexer, blocks small enough
# that a test's prompt is sparse). Its processor's tokens are fixed strings (]<]image[>[ ...), no processor files.

MINIMAX_SPECIALS = ["<|endoftext|>", "]~b]", "]~!b[", "[e~[", "]<]image[>[", "]<]video[>[", "]<]start of image[>[",
                    "]<]end of image[>["]


def _minimax_m3_vl(m, ids, vocab):
    text = shrink(m.TextConfig, model_type="minimax_m3", vocab_size=vocab, intermediate_size=WIDTH,
                  dense_intermediate_size=2 * WIDTH, shared_intermediate_size=WIDTH,
                  mlp_layer_types=["dense", "sparse"], layer_types=["full_attention", "minimax_m3_sparse"],
                  index_n_heads=2, index_head_dim=16, index_block_size=8, index_topk_blocks=2, index_local_blocks=1)
    return {"model_type": "minimax_m3_vl", "text_config": text,
            "vision_config": shrink(m.VisionConfig, model_type="clip_vision_model", patch_size=14),
            "projector_hidden_size": WIDTH, "image_token_index": ids["]<]image[>["],
            "video_token_index": ids["]<]video[>["], "vision_start_token_id": ids["]<]start of image[>["],
            "vision_end_token_id": ids["]<]end of image[>["], "vocab_size": vocab, "eos_token_id": ids["[e~["]}


_add("minimax_m3_vl", Recipe(
    specials=MINIMAX_SPECIALS, eos="[e~[", config=_minimax_m3_vl,
    template=_turns("{{ ']~b]' + message['role'] + '\\n' }}", "]<]image[>[", "[e~[\\n", "]~b]ai\\n",
                    start="]~!b[", video="]<]video[>[")))


# ---- Cohere Compass: a Qwen3-VL-like tower (patches of 16 merged 2x2, deepstack), Aya's Cohere turns, a Command-A
# style text model (parallel blocks, layer norm, sliding layers with RoPE and multimodal positions, global ones
# without). mlx-vlm's loader builds its image processor from config.json (sizes from vision_config, pixels from
# min_pixels/max_pixels).

COMPASS_SPECIALS = AYA_SPECIALS + ["<|IMAGE_PAD|>", "<|VISION_START|>", "<|VISION_END|>"]


def _cohere_compass(m, ids, vocab):
    text = shrink(m.TextConfig, model_type="cohere_compass_text", vocab_size=vocab, sliding_window=16,
                  layer_types=["sliding_attention", "full_attention"],  # RoPE per layer type: none for full
                  rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0,
                                                         "mrope_section": [4, 2, 2]}},
                  eos_token_id=ids["<|END_OF_TURN_TOKEN|>"], pad_token_id=ids["<PAD>"])
    vision = shrink(m.VisionConfig, model_type="cohere_compass_vision", patch_size=16, num_position_embeddings=64,
                    deepstack_visual_indexes=[0])
    return {"model_type": "cohere_compass", "text_config": text, "vision_config": vision,
            "image_token_id": ids["<|IMAGE_PAD|>"], "vision_start_token_id": ids["<|VISION_START|>"],
            "vision_end_token_id": ids["<|VISION_END|>"], "min_pixels": 64 * 64, "max_pixels": 256 * 256,
            "eos_token_id": ids["<|END_OF_TURN_TOKEN|>"], "pad_token_id": ids["<PAD>"]}


_add("cohere_compass", Recipe(
    specials=COMPASS_SPECIALS, eos="<|END_OF_TURN_TOKEN|>", config=_cohere_compass,
    template=_turns("{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' }}", "<|VISION_START|><|IMAGE_PAD|><|VISION_END|>",
                    "<|END_OF_TURN_TOKEN|>", "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")))


# ---- Muse Glimmer: its own tower (patches of 14, windowed attention over windows the size of its position table,
# pixel-shuffled 2x2), an adapter, a Muse text model (sliding and full layers, the full one without RoPE). A
# 4x4 position table makes the test's pictures span several windows.

MUSE_SPECIALS = ["<|endoftext|>", "<|begin_of_text|>", "<|eot|>", "<|header_start|>", "<|header_end|>", "<|patch|>",
                 "<|image_start|>", "<|image_end|>", "<|video|>"]


def _muse_glimmer(m, ids, vocab):
    text = shrink(m.TextConfig, model_type="muse_glimmer_text", vocab_size=vocab, sliding_window=16,
                  bos_token_id=ids["<|begin_of_text|>"], eos_token_id=ids["<|eot|>"], pad_token_id=ids["<|endoftext|>"])
    vision = shrink(m.VisionConfig, model_type="muse_glimmer_vision", patch_size=14, pos_emb_height=4, pos_emb_width=4)
    return {"model_type": "muse_glimmer", "text_config": text, "vision_config": vision,
            "image_token_id": ids["<|patch|>"], "video_token_id": ids["<|video|>"], "out_hidden_size": 4 * WIDTH,
            "projector_hidden_size": WIDTH, "eos_token_id": ids["<|eot|>"]}


_add("muse_glimmer", Recipe(
    specials=MUSE_SPECIALS, eos="<|eot|>", config=_muse_glimmer, named={"bos_token": "<|begin_of_text|>"},
    template=_turns("{{ '<|header_start|>' + message['role'] + '<|header_end|>\\n\\n' }}", "<|patch|>", "<|eot|>",
                    "<|header_start|>assistant<|header_end|>\\n\\n", start="{{ bos_token }}")))
