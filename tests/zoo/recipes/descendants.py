"""Recipes: Qwen-VL and MoonViT descendants: Qwen3-Omni MoE, Kimi K3, LocateAnything, ZAYA1-VL, Qwen4-exp.
"""

from vision_fixture import CHAT_TEMPLATE, SPECIALS

from zoo.recipes.base import QWEN, Recipe, _MROPE, _MROPE_PARTIAL, _add, _qwen3, _qwen_preprocessor, _turns
from zoo.vision_shrink import WIDTH, shrink


# ---- Qwen3-Omni MoE: the Qwen3-VL tower and tokens inside a "thinker" (with an audio tower, built small, as every
# thinker has one), a Qwen3 MoE text model; the talker and its vocoder (speech out) are not built. Its processor
# also loads Whisper's feature extractor and names its media tokens on the tokenizer.

OMNI_SPECIALS = SPECIALS + ["<|audio_start|>", "<|audio_end|>", "<|audio_pad|>"]
# The Qwen-VL template with a clip as Qwen3-Omni writes one (its audio tokens between their markers).
OMNI_TEMPLATE = CHAT_TEMPLATE.replace(
    "{% elif part['type'] == 'text' %}",
    "{% elif part['type'] == 'audio' %}{{ '<|audio_start|><|audio_pad|><|audio_end|>' }}"
    "{% elif part['type'] == 'text' %}")
_OMNI_AUDIO = {"d_model": WIDTH, "encoder_layers": 1, "num_hidden_layers": 1, "encoder_attention_heads": 2,
               "encoder_ffn_dim": 2 * WIDTH, "output_dim": WIDTH, "downsample_hidden_size": 16}


def _qwen3_omni_moe(m, ids, vocab):
    thinker = _qwen3("qwen3_omni_moe", {"rope_scaling": _MROPE}, {"deepstack_visual_indexes": [0]})(m, ids, vocab)
    thinker["text_config"]["model_type"] = "qwen3_omni_moe_text_encoder"  # the names its tower checks
    thinker["vision_config"]["model_type"] = "qwen3_omni_moe_vision_encoder"
    thinker.update(model_type="qwen3_omni_moe_thinker", audio_config=_OMNI_AUDIO,
                   audio_token_id=ids["<|audio_pad|>"], audio_start_token_id=ids["<|audio_start|>"],
                   audio_end_token_id=ids["<|audio_end|>"])
    # The config classes want a talker's text part even when no talker is built (enable_audio_output false).
    return {"model_type": "qwen3_omni_moe", "thinker_config": thinker, "enable_audio_output": False,
            "talker_config": {"text_config": thinker["text_config"]},
            "eos_token_id": ids["<|im_end|>"], "im_start_token_id": ids["<|im_start|>"],
            "im_end_token_id": ids["<|im_end|>"]}


_add("qwen3_omni_moe", Recipe(
    specials=OMNI_SPECIALS, eos="<|im_end|>", template=OMNI_TEMPLATE, config=_qwen3_omni_moe,
    tokenizer_config={"extra_special_tokens": {
        "image_token": "<|image_pad|>", "video_token": "<|video_pad|>", "audio_token": "<|audio_pad|>",
        "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>",
        "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>"}},
    files={"preprocessor_config.json": {**_qwen_preprocessor(16), "feature_extractor_type": "WhisperFeatureExtractor",
                                        "feature_size": 128, "sampling_rate": 16000, "hop_length": 160,
                                        "chunk_length": 30, "n_fft": 400, "padding_value": 0.0,
                                        "return_attention_mask": True}}))


# ---- Kimi K3: a 3-D MoonViT (its sizes under vt_ names), a Kimi Linear text model (a delta-attention layer, then
# latent attention; MoE). Its processor renders the chat itself in Python (XTML turns between <|open|> and
# <|close|>): like the real checkpoints, no chat template. Its prompt opens with a long system turn (the thinking
# effort), some 250 tokens beside the image's 30: at scale 4 the image barely moved the last token's logits.

KIMI_K3_SPECIALS = ["<|pad|>", "<|end_of_msg|>", "<|open|>", "<|close|>", "<|sep|>", "<|media_begin|>",
                    "<|media_content|>", "<|media_end|>", "<|media_pad|>", "<|kimi_image_placeholder|>"]


def _kimi_k3(m, ids, vocab):
    text = shrink(m.TextConfig, model_type="kimi_linear", vocab_size=vocab, q_lora_rank=None, num_experts=4,
                  num_experts_per_token=2, num_shared_experts=1, first_k_dense_replace=1,
                  linear_attn_config={"kda_layers": [1], "num_heads": 2, "head_dim": 16, "short_conv_kernel_size": 4})
    vision = {"model_type": "moonvit3d", "patch_size": 14, "init_pos_emb_height": 8, "init_pos_emb_width": 8,
              "init_pos_emb_time": 2, "vt_num_attention_heads": 2, "vt_num_hidden_layers": 1, "vt_hidden_size": WIDTH,
              "vt_intermediate_size": 2 * WIDTH, "qkv_hidden_size": WIDTH, "mm_hidden_size": WIDTH,
              "text_hidden_size": WIDTH, "merge_kernel_size": [2, 2]}
    return {"model_type": "kimi_k3", "text_config": text, "vision_config": vision, "vocab_size": vocab,
            "media_placeholder_token_id": ids["<|media_pad|>"], "eos_token_id": [ids["<|end_of_msg|>"]]}


_add("kimi_k3", Recipe(
    specials=KIMI_K3_SPECIALS, eos="<|end_of_msg|>", template=None, config=_kimi_k3, scale=8.0,
    files={"preprocessor_config.json": {"media_proc_cfg": {"patch_size": 14, "in_patch_limit": 64,
                                                           "merge_kernel_size": [2, 2], "image_mean": [0.5] * 3,
                                                           "image_std": [0.5] * 3}}}))


# ---- LocateAnything: a MoonViT tower, a Qwen2 text model with tied embeddings (its loader drops any lm_head);
# the processor expands each <image-N> the chat template writes into <img><IMG_CONTEXT>...</img>.

LOCATE_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>"]


def _locateanything(m, ids, vocab):
    return {"model_type": "locateanything",
            "text_config": shrink(m.TextConfig, model_type="qwen2", vocab_size=vocab, tie_word_embeddings=True),
            "vision_config": shrink(m.VisionConfig, model_type="moonvit", patch_size=14, init_pos_emb_height=8,
                                    init_pos_emb_width=8, merge_kernel_size=[2, 2]),
            "image_token_index": ids["<IMG_CONTEXT>"], "vocab_size": vocab, "eos_token_id": [ids["<|im_end|>"]]}


_add("locateanything", Recipe(
    specials=LOCATE_SPECIALS, eos="<|im_end|>", config=_locateanything,
    template=_turns("{{ '<|im_start|>' + message['role'] + '\\n' }}", "<image-1>", "<|im_end|>\\n",
                    "<|im_start|>assistant\\n"),
    files={"preprocessor_config.json": {"patch_size": 14, "merge_kernel_size": [2, 2], "in_token_limit": 64}}))


# ---- ZAYA1-VL: the Qwen2.5-VL tower (patches of 14) and image processor, a ZAYA1 text model (compressed
# convolutional attention, a routed MoE with a skip expert, image-only LoRA adapters), its parameters at the top
# level. One key-value head: CCA's per-head key temperature starts at 0 (a lone 0 the builder sets to 1; two would
# stay 0 and every key would vanish). mlx-vlm 0.7.10's own generation fails with it (its chunked prefill calls
# language_model(inputs=...), this LanguageModel takes input_ids): the matrix checks our refusal at load.

ZAYA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>",
                 "<image>"]


def _zaya1_vl(m, ids, vocab):
    text = shrink(m.TextConfig, model_type="zaya1_vl", vocab_size=vocab, num_query_groups=1, ffn_hidden_size=2 * WIDTH,
                  zaya_mlp_expansion=16, vision_lora_rank_attn=4, vision_lora_rank_mlp=8, tie_word_embeddings=True,
                  pad_token_id=ids["<pad>"], bos_token_id=ids["<bos>"], eos_token_id=ids["<end_of_turn>"])
    return {**text, "vision_config": shrink(m.VisionConfig, model_type="qwen2_5_vl", patch_size=14, window_size=112,
                                            fullatt_block_indexes=[0]),
            "image_token_id": ids["<image>"], "vision_start_token_id": ids["<start_of_image>"],
            "vision_end_token_id": ids["<end_of_image>"]}


_add("zaya1_vl", Recipe(
    specials=ZAYA_SPECIALS, eos="<end_of_turn>", config=_zaya1_vl, named={"bos_token": "<bos>"},
    template=_turns("{{ '<start_of_turn>' + message['role'] + '\\n' }}", "<start_of_image><image><end_of_image>",
                    "<end_of_turn>\\n", "<start_of_turn>model\\n", start="{{ bos_token }}"),
    files={"preprocessor_config.json": _qwen_preprocessor(14)}))


# ---- Qwen4-exp: the Qwen3-VL tower without deepstack, Qwen3-VL's processor and tokens, an experimental text model:
# gated-delta and sparse-attention layers (a block indexer that keeps a budget of compressed key blocks: here 16
# tokens, fewer than a prompt holds, so the selection is exercised), hyper-connections, and n-gram per-layer
# embeddings on the delta layer (hashed into a few small prime-sized tables instead of 20M-row ones).

def _qwen4_exp(m, ids, vocab):
    config = _qwen3("qwen4_exp", {"rope_parameters": _MROPE_PARTIAL}, {"deepstack_visual_indexes": []})(m, ids, vocab)
    config["text_config"].update(
        layer_types=["linear_attention", "full_attention"], hc_count=2, hc_lowrank=8, ple_layer_ids=[1],
        heads_per_ngram=2, ngram_vocab_size_base=64, make_ngram_vocab_size_divisible_by=8, split_ngram_parts=2,
        # indexer_kv_heads is stated though it is the default: transformers' Qwen4-exp config, which loading the
        # processor reads, requires it in config.json
        indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=16, indexer_compress_ratio=4,
        eos_token_id=ids["<|im_end|>"])
    return config


_add("qwen4_exp", Recipe(**QWEN, config=_qwen4_exp, files={"preprocessor_config.json": _qwen_preprocessor(16)}))
