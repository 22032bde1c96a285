"""The vision matrix's recipe: what makes one family tiny, the table of recipes, and the
Qwen-VL families (the first in the table; many later families reuse their tokens and processor).
"""

import importlib
from dataclasses import dataclass, field
from typing import Callable, Dict, List

from vision_fixture import CHAT_TEMPLATE, SPECIALS, turn_template

from zoo.vision_shrink import shrink


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
    # A family whose checkpoints hold packed weights (2-bit Hadamard packs): (seeded weights, config.json) -> the
    # weights with the packed ones made from seeded dense matrices (the model's placeholders are zeros).
    packed: Callable = None


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
    # Its tower louder: at the default scale two pictures of one size gave one answer (the image did not matter).
    "indic_ocr": Recipe(**QWEN, config=_qwen3("indic_ocr", {"rope_parameters": _MROPE_PARTIAL}, {}, base="qwen3_5"),
                        files={"preprocessor_config.json": _qwen_preprocessor(16)}, scaled={"vision": 8.0}),
}


def _add(family: str, recipe: Recipe) -> None:
    RECIPES[family] = recipe


def _turns(turn: str, image: str, end: str, answer: str, start: str = "", video: str = "", audio: str = "") -> str:
    """A chat template written for these tests: `start`, each turn `turn` (the role in it), images
    as `image`, videos as `video`, audio clips as `audio`, then `end`; the generation prompt `answer`."""
    return start + turn_template(turn, image, end, answer, video, audio)
