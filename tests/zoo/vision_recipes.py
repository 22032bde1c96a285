"""How each vision-language family is made tiny: its tokens, chat template, config and
processor files.

A recipe is data plus one function from the trained tokenizer's ids to config.json;
everything about sizes comes from the generic shrink (vision_shrink.py) and only what a
family's own code insists on is written here. mlx-vlm's processors read the files named
in `files` (most families' processors are mlx-vlm's own, chosen by config.json's
model_type).
"""

import importlib
import json
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List

from vision_fixture import CHAT_TEMPLATE, SPECIALS, turn_template

from zoo.vision_shrink import TEXT, VISION, WIDTH, shrink

CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]


@dataclass
class Recipe:
    specials: List[str]  # special tokens of the trained tokenizer; the first is its pad token
    eos: str
    template: str  # the chat template (None: the checkpoint has none)
    config: Callable[[object, Dict[str, int], int], dict]  # (mlx-vlm module, token ids, vocab) -> config.json
    files: Dict[str, dict] = field(default_factory=dict)  # processor files, as JSON
    tokenizer_config: dict = field(default_factory=dict)  # entries added to tokenizer_config.json
    named: dict = field(default_factory=dict)  # more named special tokens (bos_token=...)
    scale: float = 4.0  # every matrix scaled by this: the text then depends on the image
    # Matrices left as initialised (by name): Gemma's scaled input embeddings would otherwise
    # drown the layers, and greedy repeats one token whatever the prompt.
    unscaled: tuple = ()
    # Matrices scaled by another factor (name part -> factor): a deep tower kept at its full size (FastViTHD's 44
    # blocks) loses the image at 1 and overflows at the default.
    scaled: Dict[str, float] = field(default_factory=dict)
    # A family whose processor reads its own tokenizer format: (target folder, recipe) -> the saved tokenizer,
    # in place of the byte-level BPE.
    tokenizer: Callable = None
    # Special tokens (of `specials`) at the ids the family's processor writes in code; the vocabulary is padded with
    # fillers up to them (zoo/fixed_ids.py).
    fixed: Dict[str, int] = field(default_factory=dict)


def module_of(family: str):
    return importlib.import_module(f"mlx_vlm.models.{family}")


# ---- Qwen-VL: <|vision_start|><|image_pad|><|vision_end|>, images resized to patches of 14 or 16

def _qwen_preprocessor(patch: int) -> dict:
    return {"min_pixels": 4 * patch * patch, "max_pixels": 64 * patch * patch, "patch_size": patch,
            "temporal_patch_size": 2, "merge_size": 2, "image_mean": CLIP_MEAN, "image_std": CLIP_STD,
            "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True}


def _qwen_ids(ids: Dict[str, int]) -> dict:
    return {"image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
            "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"],
            "eos_token_id": ids["<|im_end|>"], "bos_token_id": ids["<|endoftext|>"]}


def _qwen3(family: str, text: dict, vision: dict, base: str = None) -> Callable:
    """`base`: the architecture a family wraps (its text and vision configs are that one's)."""
    def config(m, ids, vocab):
        return {"model_type": family, "text_config": shrink(m.TextConfig, model_type=base or family,
                                                                vocab_size=vocab, **text),
                "vision_config": shrink(m.VisionConfig, model_type=base or family, patch_size=16,
                                        num_position_embeddings=64, **vision),
                "vocab_size": vocab, **_qwen_ids(ids)}
    return config


def _qwen2(family: str, vision: dict) -> Callable:
    def config(m, ids, vocab):  # text parameters at the top level, as Qwen2-VL checkpoints have them
        text = shrink(m.TextConfig, model_type=family, vocab_size=vocab, head_dim=None,
                      rope_scaling={"type": "mrope", "mrope_section": [4, 2, 2]})
        text.pop("head_dim")
        return {**text, "vision_config": shrink(m.VisionConfig, model_type=family, **vision), **_qwen_ids(ids)}
    return config


_MROPE = {"type": "mrope", "mrope_section": [4, 2, 2]}  # sums to head_dim / 2
_MROPE_PARTIAL = {"type": "default", "mrope_section": [1, 1, 0], "rope_theta": 10000,
                  "partial_rotary_factor": 0.25}  # a quarter of head_dim rotates

QWEN = dict(specials=SPECIALS, eos="<|im_end|>", template=CHAT_TEMPLATE)

RECIPES: Dict[str, Recipe] = {
    "qwen2_vl": Recipe(**QWEN, config=_qwen2("qwen2_vl", {"mlp_ratio": 2, "patch_size": 14}),
                       files={"preprocessor_config.json": _qwen_preprocessor(14)}),
    "qwen2_5_vl": Recipe(**QWEN, config=_qwen2("qwen2_5_vl", {"patch_size": 14, "window_size": 112,
                                                               "fullatt_block_indexes": [0]}),
                         files={"preprocessor_config.json": _qwen_preprocessor(14)}),
    "qwen3_vl": Recipe(**QWEN, config=_qwen3("qwen3_vl", {"rope_scaling": _MROPE},
                                             {"deepstack_visual_indexes": [0]}),
                       files={"preprocessor_config.json": _qwen_preprocessor(16)}),
    "qwen3_vl_moe": Recipe(**QWEN, config=_qwen3("qwen3_vl_moe", {"rope_scaling": _MROPE},
                                                 {"deepstack_visual_indexes": [0]}),
                           files={"preprocessor_config.json": _qwen_preprocessor(16)}),
    "qwen3_5": Recipe(**QWEN, config=_qwen3("qwen3_5", {"rope_parameters": _MROPE_PARTIAL}, {}),
                      files={"preprocessor_config.json": _qwen_preprocessor(16)}),
    "qwen3_5_moe": Recipe(**QWEN, config=_qwen3("qwen3_5_moe", {"rope_parameters": _MROPE_PARTIAL}, {}),
                          files={"preprocessor_config.json": _qwen_preprocessor(16)}),
    # IndicOCR's OCR stage: Qwen 3.5 itself under its own name (an Indic vocabulary, ids in the config).
    "indic_ocr": Recipe(**QWEN, config=_qwen3("indic_ocr", {"rope_parameters": _MROPE_PARTIAL}, {}, base="qwen3_5"),
                        files={"preprocessor_config.json": _qwen_preprocessor(16)}),
}


def _add(family: str, recipe: Recipe) -> None:
    RECIPES[family] = recipe


def _turns(turn: str, image: str, end: str, answer: str, start: str = "", video: str = "") -> str:
    """A chat template written for these tests: `start`, each turn `turn` (the role in it), images
    as `image`, videos as `video`, then `end`; the generation prompt `answer`."""
    return start + turn_template(turn, image, end, answer, video)


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
    template=_turns("{{ '<|turn>' + message['role'] + '\\n' }}", "<|image|>", "<turn|>\\n", "<|turn>model\\n",
                    start="{{ bos_token }}", video="<|video|>"),
    tokenizer_config={"extra_special_tokens": {"image_token": "<|image|>", "boi_token": "<|image>",
                                               "eoi_token": "<image|>", "audio_token": "<|audio|>",
                                               "boa_token": "<|audio>", "eoa_token": "<audio|>",
                                               "video_token": "<|video|>"}},
    files={"processor_config.json": {"image_processor": {"patch_size": 14, "max_soft_tokens": 4,
                                                          "pooling_kernel_size": 2},
                                      # 70 soft tokens a frame: the fewest its video processor allows
                                      "video_processor": {"patch_size": 14, "max_soft_tokens": 70,
                                                          "pooling_kernel_size": 2, "num_frames": 2}}}))


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


# ==== Qwen-VL and MoonViT descendants: Qwen3-Omni MoE, Kimi K3, LocateAnything, ZAYA1-VL, Qwen4-exp

# ---- Qwen3-Omni MoE: the Qwen3-VL tower and tokens inside a "thinker" (with an audio tower, built small, as every
# thinker has one), a Qwen3 MoE text model; the talker and its vocoder (speech out) are not built. Its processor
# also loads Whisper's feature extractor and names its media tokens on the tokenizer.

OMNI_SPECIALS = SPECIALS + ["<|audio_start|>", "<|audio_end|>", "<|audio_pad|>"]
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
    specials=OMNI_SPECIALS, eos="<|im_end|>", template=CHAT_TEMPLATE, config=_qwen3_omni_moe,
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


# ==== Newer towers and text models: gemma4_unified, glm5_next, step3p7, minimax_m3_vl, cohere_compass, muse_glimmer

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


_add("gemma4_unified", replace(RECIPES["gemma4"], config=_gemma4_unified,
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


# ==== Omni families (image, video and audio parts): nemotron_h_nano_omni, mimo_v2, inkling. Images only here, as
# audio is not served; muse_spark, the fourth of the group, cannot run on the CPU (vision_families.LIBRARY_CANNOT).

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
                    "<|assistant|>"),
    files={"processor_config.json": {"image_token": "<|image|>", "image_bos_token": "<|content_image|>",
                                     "audio_token": "<|audio|>", "audio_bos_token": "<|content_audio_input|>"}}))


# ==== Processors that write an image's tokens themselves: Molmo, Molmo 2, MolmoPoint, Moondream 3

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


# ==== MiniCPM: MiniCPM-V 4.6 and 4.7, MiniCPM-o (image slices, per-image list outputs)

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


_add("minicpmv4_7", Recipe(specials=MINICPM_SPECIALS, eos="<|im_end|>", template=CHAT_TEMPLATE, config=_minicpmv4_7,
                           files=MINICPM_FILES))


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


# ==== Encoder-decoder and Falcon families (florence2, nemotron_parse, falcon_ocr, falcon_perception)

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


# ==== Processors that write their image tokens' ids in code (DotsOCR, HunYuan-VL, Jina-VLM). The tiny
# tokenizer reaches those ids (`fixed`, fillers below them: zoo/fixed_ids.py), so the embedding and the head have
# 120-150k rows; a text model _NARROW wide keeps each a few MB.

_NARROW = 8


def _narrow(config_class, **overrides) -> dict:
    """The generic text shrink at width _NARROW (heads 4 wide where the config derives them from the width)."""
    return shrink(config_class, hidden_size=_NARROW, intermediate_size=2 * _NARROW, **overrides)


def _chatml(image: str) -> str:
    """ChatML turns, images written as `image`."""
    return _turns("{{ '<|im_start|>' + message['role'] + '\\n' }}", image, "<|im_end|>\\n",
                  "<|im_start|>assistant\\n")


# ---- dots.ocr: a NaViT tower (Qwen-VL patches of 14, one frame, merged 2x2), a Qwen2 text model (mlx-vlm's
# llava_bunny one); its processor (Qwen 2.5-VL's) marks <|imgpad|> as 151665.

def _dots_ocr(m, ids, vocab):
    return {"model_type": "dots_ocr", "text_config": _narrow(m.TextConfig, vocab_size=vocab),
            "vision_config": shrink(m.VisionConfig, hidden_size=_NARROW, patch_size=14, temporal_patch_size=1),
            "image_token_id": ids["<|imgpad|>"], "vocab_size": vocab, "eos_token_id": [ids["<|im_end|>"]]}


_add("dots_ocr", Recipe(
    specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|img|>", "<|endofimg|>", "<|imgpad|>"],
    eos="<|im_end|>", template=_chatml("<|img|><|imgpad|><|endofimg|>"), config=_dots_ocr,
    fixed={"<|imgpad|>": 151665},
    files={"preprocessor_config.json": {**_qwen_preprocessor(14), "image_processor_type": "Qwen2VLImageProcessor",
                                        "temporal_patch_size": 1}}))


# ---- HunyuanOCR (hunyuan_vl): a ViT of patches of 16 merged 2x2 by convolutions, rows closed by a newline feature
# and the image framed by begin and end features, a Hunyuan text model with XD-RoPE (four position streams). Its
# processor writes the image's tokens as 120120 framed by 120118/120119, and spells the image's span with the token
# at the top of the vocabulary; its image processor takes no file (at least 512x512 pixels: ~280 tokens an image).
# The head is untied (the shrink's default; the family ties it): tied, greedy repeats one token from the start.

def _hunyuan_vl(m, ids, vocab):
    rope = {**m.TextConfig().rope_scaling, "xdrope_section": [2, 2, 2, 2]}  # sums to head_dim / 2
    return {"model_type": "hunyuan_vl",
            "text_config": _narrow(m.TextConfig, vocab_size=vocab, org_vocab_size=vocab, attention_head_dim=16,
                                   rope_scaling=rope),
            "vision_config": shrink(m.VisionConfig, out_hidden_size=_NARROW, patch_size=16, max_image_size=256),
            "image_start_token_id": ids["<img_start>"], "image_end_token_id": ids["<img_end>"],
            "image_token_id": ids["<image>"], "vocab_size": vocab, "org_vocab_size": vocab,
            "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"]}


_add("hunyuan_vl", Recipe(
    specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<img_start>", "<img_end>", "<image>", "<placeholder>"],
    eos="<|im_end|>", template=_chatml("<img_start><image><img_end>"), config=_hunyuan_vl, scale=3.0,
    fixed={"<img_start>": 120118, "<img_end>": 120119, "<image>": 120120, "<placeholder>": 120817}))


# ---- Jina-VLM (model_type jvlm, the name its processor is registered under): a SigLIP-style tower on 378-pixel
# crops of patches of 14 (a thumbnail and tiles), two of its layers pooled 2x2 by attention, a Qwen3-like text
# model. Its image processor, built with no arguments, sizes crops as above and writes each crop's tokens as
# 151665-151668 (patch, start, end, column); the prompt's <|image|> is where they go.

def _jina_vlm(m, ids, vocab):
    return {"model_type": "jvlm",
            "text_config": _narrow(m.TextConfig, vocab_size=vocab, additional_vocab_size=0),
            "vision_config": shrink(m.VisionConfig, head_dim=16, image_size=378, patch_size=14, vit_layers=[-1, -2],
                                    output_size=_NARROW, connector_hidden_size=WIDTH),
            "image_token_index": ids["<|image|>"], "vocab_size": vocab, "bos_token_id": ids["<|endoftext|>"],
            "pad_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"]}


_add("jina_vlm", Recipe(
    specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|image|>", "<im_patch>", "<im_start>", "<im_end>",
              "<im_col>"],
    eos="<|im_end|>", template=_chatml("<|image|>"), config=_jina_vlm, scale=6.0,
    fixed={"<im_patch>": 151665, "<im_start>": 151666, "<im_end>": 151667, "<im_col>": 151668}))


# ==== Families whose vision towers mlx-vlm fixes in code, the tower kept at that size (seeded random
# weights), everything else tiny.

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
