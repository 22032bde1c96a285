"""Recipes of families that put one run of image tokens per picture in the prompt: Idefics3 /
SmolVLM, LLaVA 1.5, Gemma 3 and PaliGemma, Pixtral and Mistral 3, Llama 4, GLM-4V, Kimi-VL, InternVL,
Gemma 4.
"""

from typing import Callable

from zoo.recipes.base import CLIP_MEAN, CLIP_STD, Recipe, _add, _turns
from zoo.vision_shrink import WIDTH, shrink


# ---- Idefics3 / SmolVLM: SigLIP tower, pixel shuffle, a Llama text model

IDEFICS3_TEMPLATE = _turns("{{ message['role'].capitalize() + ':' }}", "<image>", "<end_of_utterance>\\n", "Assistant:")

def _idefics3(family: str, names) -> Recipe:
    def config(m, ids, vocab):
        return {"model_type": family, "architectures": [names[0]],
                "text_config": shrink(m.TextConfig, model_type="llama", vocab_size=vocab),
                "vision_config": shrink(m.VisionConfig, model_type="idefics3_vision", patch_size=14, image_size=56),
                "image_token_id": ids["<image>"], "scale_factor": 2, "vocab_size": vocab,
                "eos_token_id": [ids["<end_of_utterance>"]]}
    return Recipe(
        specials=["<|endoftext|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>", "<global-img>"],
        eos="<end_of_utterance>", template=IDEFICS3_TEMPLATE, config=config,
        files={"preprocessor_config.json": {
            "image_processor_type": names[1], "processor_class": names[2], "do_resize": True,
            "size": {"longest_edge": 56}, "do_image_splitting": False, "max_image_size": {"longest_edge": 56},
            "do_rescale": True, "do_normalize": True, "do_convert_rgb": True, "do_pad": True,
            "image_mean": [0.5] * 3, "image_std": [0.5] * 3, "resample": 1},
            "processor_config.json": {"processor_class": names[2], "image_seq_len": 4}})


_add("idefics3", _idefics3("idefics3", ("Idefics3ForConditionalGeneration", "Idefics3ImageProcessor",
                                        "Idefics3Processor")))
_add("smolvlm", _idefics3("smolvlm", ("SmolVLMForConditionalGeneration", "SmolVLMImageProcessor",
                                      "SmolVLMProcessor")))


# ---- LLaVA 1.5: CLIP tower, projector, a Llama text model

LLAVA_TEMPLATE = _turns("{{ message['role'].upper() + ': ' }}", "<image>\\n", "<|im_end|>\\n", "ASSISTANT:")

def _llava(m, ids, vocab):
    return {"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"],
            "text_config": shrink(m.TextConfig, model_type="llama", vocab_size=vocab),
            "vision_config": shrink(m.VisionConfig, model_type="clip_vision_model", num_hidden_layers=2,
                                    image_size=56, patch_size=14),
            "image_token_index": ids["<image>"], "vision_feature_select_strategy": "default",
            "vision_feature_layer": -2, "vocab_size": vocab, "eos_token_id": ids["<|im_end|>"]}


_add("llava", Recipe(
    specials=["<|endoftext|>", "<|im_end|>", "<image>"], eos="<|im_end|>", template=LLAVA_TEMPLATE, config=_llava,
    files={"preprocessor_config.json": {
        "image_processor_type": "CLIPImageProcessor", "processor_class": "LlavaProcessor",
        "size": {"shortest_edge": 56}, "crop_size": {"height": 56, "width": 56}, "do_resize": True,
        "do_center_crop": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True,
        "image_mean": CLIP_MEAN, "image_std": CLIP_STD, "resample": 3},
        "processor_config.json": {"processor_class": "LlavaProcessor", "patch_size": 14, "image_token": "<image>",
                                  "vision_feature_select_strategy": "default", "num_additional_image_tokens": 1}}))


# ---- Gemma 3 and PaliGemma: SigLIP tower, a Gemma text model

GEMMA3_TEMPLATE = _turns("{{ '<start_of_turn>' + message['role'] + '\\n' }}", "<start_of_image>", "<end_of_turn>\\n",
                         "<start_of_turn>model\\n")

def _gemma3(m, ids, vocab):
    return {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
            "text_config": shrink(m.TextConfig, model_type="gemma3_text", vocab_size=vocab, query_pre_attn_scalar=16,
                                  sliding_window=16, sliding_window_pattern=2, mm_tokens_per_image=4),
            "vision_config": shrink(m.VisionConfig, model_type="siglip_vision_model", patch_size=14, image_size=56),
            "image_token_index": ids["<image_soft_token>"], "mm_tokens_per_image": 4,
            "boi_token_index": ids["<start_of_image>"], "eoi_token_index": ids["<end_of_image>"],
            "vocab_size": vocab, "hidden_size": WIDTH, "eos_token_id": [ids["<end_of_turn>"]],
            "pad_token_id": ids["<pad>"]}


_add("gemma3", Recipe(
    specials=["<pad>", "<end_of_turn>", "<start_of_turn>", "<start_of_image>", "<end_of_image>", "<image_soft_token>"],
    eos="<end_of_turn>", template=GEMMA3_TEMPLATE, config=_gemma3, scale=8.0, unscaled=("embed_tokens",),
    tokenizer_config={"extra_special_tokens": {"image_token": "<image_soft_token>", "boi_token": "<start_of_image>",
                                               "eoi_token": "<end_of_image>"}},
    files={"preprocessor_config.json": {
        "image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor",
        "size": {"height": 56, "width": 56}, "do_resize": True, "do_rescale": True, "do_normalize": True,
        "do_convert_rgb": True, "do_pan_and_scan": False, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
        "resample": 2},
        "processor_config.json": {"processor_class": "Gemma3Processor", "image_seq_length": 4}}))


def _paligemma(m, ids, vocab):
    return {"model_type": "paligemma", "architectures": ["PaliGemmaForConditionalGeneration"],
            "text_config": shrink(m.TextConfig, model_type="gemma", vocab_size=vocab, num_image_tokens=16),
            "vision_config": shrink(m.VisionConfig, model_type="siglip_vision_model", patch_size=14, image_size=56),
            "image_token_index": ids["<image>"], "vocab_size": vocab, "hidden_size": WIDTH,
            "pad_token_id": ids["<pad>"], "eos_token_id": ids["<eos>"], "bos_token_id": ids["<bos>"]}


# PaliGemma takes no chat: mlx-vlm prompts it with the images' tokens and the question.
_add("paligemma", Recipe(
    specials=["<pad>", "<eos>", "<bos>", "<image>"], eos="<eos>", config=_paligemma,
    template=_turns("", "<image>", "\\n", ""), named={"bos_token": "<bos>"},
    files={"preprocessor_config.json": {
        "image_processor_type": "SiglipImageProcessor", "processor_class": "PaliGemmaProcessor",
        "size": {"height": 56, "width": 56}, "do_resize": True, "do_rescale": True, "do_normalize": True,
        "do_convert_rgb": True, "image_mean": [0.5] * 3, "image_std": [0.5] * 3, "resample": 3,
        "image_seq_length": 16},
        "processor_config.json": {"processor_class": "PaliGemmaProcessor", "image_seq_length": 16}}))


# ---- Pixtral and Mistral 3: a Pixtral tower ([IMG] per patch, [IMG_BREAK] per row), a Mistral text model

PIXTRAL_SPECIALS = ["<pad>", "</s>", "<s>", "[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]"]
# Written for these tests: Mistral's [INST] turns, the images first.
PIXTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '[INST]' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part %}{{ '[IMG]' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '[/INST]' }}"
    "{% else %}{{ message['content'] if message['content'] is string else '' }}{{ '</s>' }}{% endif %}"
    "{% endfor %}")


def _pixtral_files(merge: int) -> dict:
    return {"preprocessor_config.json": {
        "image_processor_type": "PixtralImageProcessor", "patch_size": {"height": 14, "width": 14},
        "size": {"longest_edge": 56 * merge}, "do_resize": True, "do_rescale": True, "do_normalize": True,
        "do_convert_rgb": True, "image_mean": CLIP_MEAN, "image_std": CLIP_STD, "resample": 3},
        "processor_config.json": {"patch_size": 14, "spatial_merge_size": merge, "image_token": "[IMG]",
                                  "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]"}}


def _pixtral_family(family: str, merge: int) -> Recipe:
    def config(m, ids, vocab):
        top = {"spatial_merge_size": merge} if family == "mistral3" else {}
        return {"model_type": family, "text_config": shrink(m.TextConfig, model_type="mistral", vocab_size=vocab),
                "vision_config": shrink(m.VisionConfig, model_type="pixtral", head_dim=16, image_size=56 * merge,
                                        patch_size=14),
                "image_token_index": ids["[IMG]"], "vocab_size": vocab, "eos_token_id": ids["</s>"], **top}
    return Recipe(specials=PIXTRAL_SPECIALS, eos="</s>", template=PIXTRAL_TEMPLATE, config=config,
                  named={"bos_token": "<s>"}, files=_pixtral_files(merge))


_add("pixtral", _pixtral_family("pixtral", 1))
_add("mistral3", _pixtral_family("mistral3", 2))


# ---- Llama 4: its own tower with pixel shuffle, <|patch|> per image token, a chunked-attention MoE text model

LLAMA4_SPECIALS = ["<|finetune_right_pad_id|>", "<|eot|>", "<|begin_of_text|>", "<|header_start|>", "<|header_end|>",
                   "<|image_start|>", "<|image_end|>", "<|image|>", "<|patch|>", "<|tile_x_separator|>",
                   "<|tile_y_separator|>"]


def _llama4(m, ids, vocab):
    # The projector takes the pixel-shuffled patches: 4 x hidden_size wide, its intermediate size.
    vision = dict(model_type="llama4_vision_model", hidden_size=WIDTH, image_size=56, initializer_range=0.02,
                  intermediate_size=4 * WIDTH, norm_eps=1e-5, num_attention_heads=2, num_channels=3,
                  num_hidden_layers=1, patch_size=14, pixel_shuffle_ratio=0.5, projector_dropout=0.0,
                  projector_input_dim=WIDTH, projector_output_dim=WIDTH, rope_theta=10000.0,
                  vision_feature_layer=-1, vision_feature_select_strategy="default", vision_output_dim=WIDTH)
    return {"model_type": "llama4",
            "text_config": shrink(m.TextConfig, model_type="llama4_text", vocab_size=vocab, num_experts_per_tok=1,
                                  # chunks longer than a test's prompt: the text sees the image (with two
                                  # layers, none of them global); the cache is still Llama 4's chunked one
                                  intermediate_size_mlp=2 * WIDTH, attention_chunk_size=4096,
                                  bos_token_id=ids["<|begin_of_text|>"], eos_token_id=ids["<|eot|>"],
                                  pad_token_id=ids["<|finetune_right_pad_id|>"]),
            "vision_config": vision, "image_token_index": ids["<|patch|>"], "vocab_size": vocab,
            "eos_token_id": [ids["<|eot|>"]]}


_add("llama4", Recipe(
    specials=LLAMA4_SPECIALS, eos="<|eot|>", config=_llama4, named={"bos_token": "<|begin_of_text|>"},
    template=_turns("{{ '<|header_start|>' + message['role'] + '<|header_end|>\\n\\n' }}", "<|image|>", "<|eot|>",
                    "<|header_start|>assistant<|header_end|>\\n\\n", start="{{ bos_token }}"),
    files={"preprocessor_config.json": {"size": {"height": 56, "width": 56}, "max_patches": 1,
                                        "image_mean": [0.5] * 3, "image_std": [0.5] * 3}}))


# ---- GLM-4V: Qwen-like patches and mRoPE, <|begin_of_image|><|image|><|end_of_image|>

GLM_SPECIALS = ["<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|begin_of_image|>",
                "<|end_of_image|>", "<|image|>", "<|begin_of_video|>", "<|end_of_video|>", "<|video|>"]
GLM_TEMPLATE = _turns("{{ '<|' + message['role'] + '|>\\n' }}", "<|begin_of_image|><|image|><|end_of_image|>", "",
                      "<|assistant|>\\n", start="[gMASK]<sop>")


def _glm_shared(m, vision_type: str, ids, vocab) -> dict:
    """What the GLM-4V and GLM-OCR configs share: the vision tower and most token ids."""
    return {"vision_config": shrink(m.VisionConfig, model_type=vision_type, patch_size=14, image_size=56,
                                    spatial_merge_size=2, temporal_patch_size=2),
            "image_token_id": ids["<|image|>"], "video_token_id": ids["<|video|>"], "vocab_size": vocab,
            "hidden_size": WIDTH, "pad_token_id": ids["<|endoftext|>"], "eos_token_id": _glm_eos(ids)}


def _glm_eos(ids) -> list:
    return [ids["<|endoftext|>"], ids["<|user|>"]]


def _glm(family: str, text: dict) -> Callable:
    def config(m, ids, vocab):
        return {"model_type": family,
                "text_config": shrink(m.TextConfig, model_type=family, vocab_size=vocab, partial_rotary_factor=0.5,
                                      rope_scaling={"rope_type": "default", "mrope_section": [2, 1, 1]},
                                      eos_token_id=_glm_eos(ids), **text),
                **_glm_shared(m, family, ids, vocab),
                "image_token_index": ids["<|image|>"], "video_token_index": ids["<|video|>"],
                "vision_start_token_id": ids["<|begin_of_image|>"], "vision_end_token_id": ids["<|end_of_image|>"]}
    return config


GLM_FILES = {"preprocessor_config.json": {
    "image_processor_type": "Glm4vImageProcessor", "size": {"shortest_edge": 4 * 28 * 28, "longest_edge": 64 * 28 * 28},
    "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2, "image_mean": CLIP_MEAN, "image_std": CLIP_STD,
    "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True}}

_add("glm4v", Recipe(specials=GLM_SPECIALS, eos="<|endoftext|>", template=GLM_TEMPLATE, config=_glm("glm4v", {}),
                     files=GLM_FILES))
_add("glm4v_moe", Recipe(specials=GLM_SPECIALS, eos="<|endoftext|>", template=GLM_TEMPLATE, files=GLM_FILES,
                         config=_glm("glm4v_moe", {"use_qk_norm": False, "attention_bias": False,
                                                   "n_routed_experts": 4, "moe_intermediate_size": WIDTH})))


# ---- Kimi-VL: MoonViT tower, a DeepSeek-V3 (latent attention, MoE) text model

KIMI_SPECIALS = ["<|endoftext|>", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>",
                 "<|media_start|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>"]


def _kimi(m, ids, vocab):
    return {"model_type": "kimi_vl",
            "text_config": shrink(m.TextConfig, model_type="deepseek_v3", vocab_size=vocab, q_lora_rank=None,
                                  n_routed_experts=4, moe_layer_freq=1),
            "vision_config": shrink(m.VisionConfig, model_type="moonvit", patch_size=14, init_pos_emb_height=8,
                                    init_pos_emb_width=8, merge_kernel_size=[2, 2]),
            "media_placeholder_token_id": ids["<|media_pad|>"], "vocab_size": vocab,
            "eos_token_id": ids["<|im_end|>"]}


_add("kimi_vl", Recipe(
    specials=KIMI_SPECIALS, eos="<|im_end|>", config=_kimi,
    template=_turns("{{ ('<|im_user|>' if message['role'] == 'user' else '<|im_assistant|>') + message['role']"
                    " + '<|im_middle|>' }}", "<|media_start|>image<|media_content|><|media_pad|><|media_end|>",
                    "<|im_end|>", "<|im_assistant|>assistant<|im_middle|>")))


# ---- InternVL: InternViT tower, pixel shuffle, <img><IMG_CONTEXT>...</img>, a Qwen text model

INTERN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>"]
INTERN_TEMPLATE = _turns("{{ '<|im_start|>' + message['role'] + '\\n' }}", "<image>\\n", "<|im_end|>\\n",
                         "<|im_start|>assistant\\n")


def _internvl(family: str, text_type: str, vision_type: str) -> Callable:
    def config(m, ids, vocab):
        image = {"image_token_id": ids["<IMG_CONTEXT>"]} if family == "internvl" else \
            {"image_token_index": ids["<IMG_CONTEXT>"]}
        return {"model_type": family,
                "text_config": shrink(m.TextConfig, model_type=text_type, vocab_size=vocab),
                "vision_config": shrink(m.VisionConfig, model_type=vision_type, patch_size=14, image_size=56),
                "downsample_ratio": 0.5, "max_dynamic_patch": 1, "min_dynamic_patch": 1, "use_thumbnail": False,
                "vocab_size": vocab, "eos_token_id": ids["<|im_end|>"], **image}
    return config


_add("internvl", Recipe(specials=INTERN_SPECIALS, eos="<|im_end|>", template=INTERN_TEMPLATE,
                        config=_internvl("internvl", "qwen3", "internvl_vision"),
                        files={"processor_config.json": {"image_seq_length": 4}}))
_add("internvl_chat", Recipe(specials=INTERN_SPECIALS, eos="<|im_end|>", template=INTERN_TEMPLATE,
                             config=_internvl("internvl_chat", "qwen2", "intern_vit_6b"),
                             files={"processor_config.json": {"num_image_token": 4}}))


# ---- Gemma 4: its own tower (pooled patches), per-layer inputs, a Gemma 4 text model

GEMMA4_TURN = "{{ '<|turn>' + message['role'] + '\\n' }}"
GEMMA4_SPECIALS = ["<pad>", "<eos>", "<bos>", "<turn|>", "<|turn>", "<|image>", "<image|>", "<|image|>", "<|audio>",
                   "<audio|>", "<|audio|>", "<|video|>"]


def _gemma4(m, ids, vocab):
    text = shrink(m.TextConfig, model_type="gemma4_text", vocab_size=vocab, vocab_size_per_layer_input=vocab,
                  global_head_dim=16, hidden_size_per_layer_input=8, num_kv_shared_layers=0, sliding_window=16,
                  sliding_window_pattern=2, layer_types=["sliding_attention", "full_attention"],
                  use_double_wide_mlp=False, tie_word_embeddings=True)
    vision = shrink(m.VisionConfig, model_type="gemma4_vision", num_key_value_heads=2, head_dim=16,
                    global_head_dim=16, patch_size=14, pooling_kernel_size=2, default_output_length=4,
                    position_embedding_size=64)
    return {"model_type": "gemma4", "text_config": text, "vision_config": vision, "vocab_size": vocab,
            "image_token_id": ids["<|image|>"], "boi_token_id": ids["<|image>"], "eoi_token_id": ids["<image|>"],
            "audio_token_id": ids["<|audio|>"], "boa_token_id": ids["<|audio>"], "eoa_token_id": ids["<audio|>"],
            "video_token_id": ids["<|video|>"], "vision_soft_tokens_per_image": 4, "hidden_size": WIDTH,
            "pad_token_id": ids["<pad>"], "eos_token_id": [ids["<eos>"], ids["<turn|>"]], "tie_word_embeddings": True}


_add("gemma4", Recipe(
    specials=GEMMA4_SPECIALS, eos="<turn|>", config=_gemma4, named={"bos_token": "<bos>"}, scale=8.0,
    unscaled=("embed_tokens",),
    template=_turns(GEMMA4_TURN, "<|image|>", "<turn|>\\n", "<|turn>model\\n", start="{{ bos_token }}",
                    video="<|video|>"),
    tokenizer_config={"extra_special_tokens": {"image_token": "<|image|>", "boi_token": "<|image>",
                                               "eoi_token": "<image|>", "audio_token": "<|audio|>",
                                               "boa_token": "<|audio>", "eoa_token": "<audio|>",
                                               "video_token": "<|video|>"}},
    files={"processor_config.json": {"image_processor": {"patch_size": 14, "max_soft_tokens": 4,
                                                          "pooling_kernel_size": 2},
                                      # 70 soft tokens a frame: the fewest its video processor allows
                                      "video_processor": {"patch_size": 14, "max_soft_tokens": 70,
                                                          "pooling_kernel_size": 2, "num_frames": 2}}}))
