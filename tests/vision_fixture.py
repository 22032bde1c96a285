"""A tiny random-weight Qwen2-VL model directory, built by the tests (no real VLM weights install).

About 0.4 MB: a 2-layer text model of width 32 with a 1-block vision tower,
a byte-level BPE trained here on a few sentences, the Qwen2-VL special tokens
and a chat template that wraps each image in <|vision_start|>...<|vision_end|>.
Random weights (scaled up) still make a deterministic function of (image, prompt): enough
to compare our engine with mlx-vlm's own generation token for token.
"""

import base64
import io
import json
import os
import tempfile
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|image_pad|>", "<|video_pad|>"]

# Written for these tests: the Qwen2-VL layout (one user turn may hold images and text).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'video' %}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

CORPUS = [
    "What is in this picture? Describe the image in one sentence.",
    "The quick brown fox jumps over the lazy dog. A red square on a blue field.",
    "Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10. Hello world! How are you today?",
    "system user assistant The cat sat on the mat while the sun was shining.",
]


def _tokenizer(target: Path, specials=SPECIALS, template=CHAT_TEMPLATE):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=specials[1:])
    fast.chat_template = template
    fast.save_pretrained(str(target))
    (target / "chat_template.jinja").write_text(template)
    return fast


def _turn_template(turn: str, image: str, end: str, answer: str) -> str:
    """A chat template written for these tests: each turn `turn` (the role in it), images as
    `image`, then `end`; the generation prompt `answer`."""
    return ("{% for message in messages %}" + turn +
            "{% if message['content'] is string %}{{ message['content'] }}"
            "{% else %}{% for part in message['content'] %}"
            "{% if part['type'] == 'image' or 'image' in part %}{{ '" + image + "' }}"
            "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
            "{% endfor %}{% endif %}"
            "{{ '" + end + "' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '" + answer + "' }}{% endif %}")


# A LLaVA-1.5 style turn, the image as one <image> marker.
LLAVA_TEMPLATE = _turn_template("{{ message['role'].upper() + ': ' }}", "<image>\\n", "<|im_end|>\\n",
                                "ASSISTANT:")


def _save_random(target: Path, config: dict, text: dict, vision: dict, scale) -> Path:
    """mlx-vlm's own model class for `config`, seeded random weights scaled by `scale(name, w)`."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.utils import get_model_and_args

    (target / "config.json").write_text(json.dumps(config, indent=1))
    module, _ = get_model_and_args(config)
    model_config = module.ModelConfig.from_dict(config)
    model_config.text_config = module.TextConfig.from_dict(text)
    model_config.vision_config = module.VisionConfig.from_dict(vision)
    mx.random.seed(0)
    model = module.Model(model_config)
    weights = {k: v * scale(k, v) for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(target / "model.safetensors"), weights)
    return target


def build_llava(target: Path, width: int = 32, image_size: int = 56) -> Path:
    """A tiny LLaVA-1.5 style model (CLIP vision tower, projector, Llama text model)."""
    target.mkdir(parents=True, exist_ok=True)
    specials = ["<|endoftext|>", "<|im_end|>", "<image>"]
    tok = _tokenizer(target, specials, LLAVA_TEMPLATE)
    image_id = tok.convert_tokens_to_ids("<image>")
    text = {"model_type": "llama", "hidden_size": width, "intermediate_size": 2 * width, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": len(tok), "rms_norm_eps": 1e-6,
            "max_position_embeddings": 4096, "tie_word_embeddings": False}
    vision = {"model_type": "clip_vision_model", "num_hidden_layers": 2, "hidden_size": width,
              "intermediate_size": 2 * width, "num_attention_heads": 2, "image_size": image_size,
              "patch_size": 14, "projection_dim": width}
    config = {"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"],
              "text_config": text, "vision_config": vision, "image_token_index": image_id,
              "vision_feature_select_strategy": "default", "vision_feature_layer": -2,
              "vocab_size": len(tok), "eos_token_id": tok.convert_tokens_to_ids("<|im_end|>")}
    (target / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "CLIPImageProcessor", "processor_class": "LlavaProcessor",
        "size": {"shortest_edge": image_size}, "crop_size": {"height": image_size, "width": image_size},
        "do_resize": True, "do_center_crop": True, "do_rescale": True, "do_normalize": True,
        "do_convert_rgb": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711], "resample": 3}, indent=1))
    (target / "processor_config.json").write_text(json.dumps({
        "processor_class": "LlavaProcessor", "patch_size": 14, "image_token": "<image>",
        "vision_feature_select_strategy": "default", "num_additional_image_tokens": 1}, indent=1))
    return _save_random(target, config, text, vision, lambda name, w: 4 if w.ndim >= 2 else 1)


# The vision families a user may load, as the tests build them (tiny_vision).
FAMILIES = ["qwen2_vl", "qwen2_5_vl", "idefics3", "smolvlm"]

VISION = {  # per family: its architecture, processor and vision tower (the text model is the same)
    "qwen2_vl": ("Qwen2VLForConditionalGeneration", "Qwen2VLProcessor", lambda width, depth: {
        "model_type": "qwen2_vl", "depth": depth, "embed_dim": width, "num_heads": 2, "mlp_ratio": 2,
        "hidden_size": width, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
        "in_channels": 3}),
    "qwen2_5_vl": ("Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLProcessor", lambda width, depth: {
        "model_type": "qwen2_5_vl", "depth": depth, "hidden_size": width, "intermediate_size": 2 * width,
        "out_hidden_size": width, "num_heads": 2, "patch_size": 14, "spatial_patch_size": 14,
        "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 112,
        "fullatt_block_indexes": [0], "in_channels": 3}),
}


def build(target: Path, width: int = 32, layers: int = 2, max_pixels: int = 12544,
          family: str = "qwen2_vl") -> Path:
    """The model directory; the defaults make the tests' 0.4 MB model, larger ones the bench's."""
    target.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer(target)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIALS}
    config = {
        "model_type": family, "architectures": [VISION[family][0]],
        "hidden_size": width, "intermediate_size": 2 * width, "num_hidden_layers": layers,
        "num_attention_heads": 2,
        "num_key_value_heads": 1, "vocab_size": len(tok), "tie_word_embeddings": True,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [width // 8, width // 16, width // 16]},
        "image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"],
        "eos_token_id": ids["<|im_end|>"], "bos_token_id": ids["<|endoftext|>"],
        "vision_config": VISION[family][2](width, layers // 2),
    }
    (target / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": VISION[family][1],
        "min_pixels": 3136, "max_pixels": max_pixels, "patch_size": 14, "temporal_patch_size": 2,
        "merge_size": 2, "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711], "do_resize": True, "do_rescale": True,
        "do_normalize": True, "do_convert_rgb": True}, indent=1))
    # At the default init scale every image gives the same constant output; 4x the
    # matrices makes the greedy text depend on the image and on the prompt.
    return _save_random(target, config, config, config["vision_config"], lambda name, w: 4 if w.ndim >= 2 else 1)


# A Gemma 3 turn; the image as its begin-of-image marker.
GEMMA3_TEMPLATE = _turn_template("{{ '<start_of_turn>' + message['role'] + '\\n' }}", "<start_of_image>",
                                 "<end_of_turn>\\n", "<start_of_turn>model\\n")


def build_gemma3(target: Path, width: int = 32, image_size: int = 56) -> Path:
    """A tiny Gemma 3 vision model (SigLIP tower, pooled to 4 tokens per image, Gemma 3 text model)."""
    target.mkdir(parents=True, exist_ok=True)
    specials = ["<pad>", "<end_of_turn>", "<start_of_turn>", "<start_of_image>", "<end_of_image>",
                "<image_soft_token>"]
    tok = _tokenizer(target, specials, GEMMA3_TEMPLATE)
    cfg_path = target / "tokenizer_config.json"
    tok_cfg = json.loads(cfg_path.read_text())
    tok_cfg["extra_special_tokens"] = {"image_token": "<image_soft_token>", "boi_token": "<start_of_image>",
                                       "eoi_token": "<end_of_image>"}
    cfg_path.write_text(json.dumps(tok_cfg, indent=1))
    ids = {t: tok.convert_tokens_to_ids(t) for t in specials}
    text = {"model_type": "gemma3_text", "hidden_size": width, "intermediate_size": 2 * width,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
            "query_pre_attn_scalar": 16, "vocab_size": len(tok), "sliding_window": 16,
            "sliding_window_pattern": 2, "mm_tokens_per_image": 4, "max_position_embeddings": 4096}
    vision = {"model_type": "siglip_vision_model", "num_hidden_layers": 1, "hidden_size": width,
              "intermediate_size": 2 * width, "num_attention_heads": 2, "patch_size": 14,
              "image_size": image_size}
    config = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
              "text_config": text, "vision_config": vision, "image_token_index": ids["<image_soft_token>"],
              "mm_tokens_per_image": 4, "boi_token_index": ids["<start_of_image>"],
              "eoi_token_index": ids["<end_of_image>"], "vocab_size": len(tok), "hidden_size": width,
              "eos_token_id": [ids["<end_of_turn>"]], "pad_token_id": ids["<pad>"]}
    (target / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor",
        "size": {"height": image_size, "width": image_size}, "do_resize": True, "do_rescale": True,
        "do_normalize": True, "do_convert_rgb": True, "do_pan_and_scan": False,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "resample": 2}, indent=1))
    (target / "processor_config.json").write_text(json.dumps({
        "processor_class": "Gemma3Processor", "image_seq_length": 4}, indent=1))
    # Tied head: the layers (not the embedding) scaled up, or greedy repeats one token.
    return _save_random(target, config, text, vision,
                        lambda name, w: 8 if w.ndim >= 2 and "embed_tokens" not in name else 1)


# An Idefics3 turn; the image as its <image> marker (the processor expands it).
IDEFICS3_TEMPLATE = _turn_template("{{ message['role'].capitalize() + ':' }}", "<image>",
                                   "<end_of_utterance>\\n", "Assistant:")


def build_idefics3(target: Path, width: int = 32, image_size: int = 56, family: str = "idefics3") -> Path:
    """A tiny Idefics3 or SmolVLM (`family`) model: SigLIP tower, pixel shuffle, Llama text model."""
    names = {"idefics3": ("Idefics3ForConditionalGeneration", "Idefics3ImageProcessor", "Idefics3Processor"),
             "smolvlm": ("SmolVLMForConditionalGeneration", "SmolVLMImageProcessor", "SmolVLMProcessor")}[family]
    target.mkdir(parents=True, exist_ok=True)
    specials = ["<|endoftext|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>", "<global-img>"]
    tok = _tokenizer(target, specials, IDEFICS3_TEMPLATE)
    ids = {t: tok.convert_tokens_to_ids(t) for t in specials}
    text = {"model_type": "llama", "hidden_size": width, "intermediate_size": 2 * width, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": len(tok), "rms_norm_eps": 1e-6,
            "max_position_embeddings": 4096, "tie_word_embeddings": False}
    vision = {"model_type": "idefics3_vision", "num_hidden_layers": 1, "hidden_size": width,
              "intermediate_size": 2 * width, "num_attention_heads": 2, "patch_size": 14,
              "image_size": image_size}
    config = {"model_type": family, "architectures": [names[0]],
              "text_config": text, "vision_config": vision, "image_token_id": ids["<image>"], "scale_factor": 2,
              "vocab_size": len(tok), "eos_token_id": [ids["<end_of_utterance>"]]}
    (target / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": names[1], "processor_class": names[2],
        "do_resize": True, "size": {"longest_edge": image_size}, "do_image_splitting": False,
        "max_image_size": {"longest_edge": image_size}, "do_rescale": True, "do_normalize": True,
        "do_convert_rgb": True, "do_pad": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "resample": 1}, indent=1))
    (target / "processor_config.json").write_text(json.dumps({
        "processor_class": names[2], "image_seq_len": (image_size // 14) ** 2 // 4}, indent=1))
    return _save_random(target, config, text, vision, lambda name, w: 4 if w.ndim >= 2 else 1)


_built = {}


def tiny_vision(family: str) -> str:
    """A tiny model of one of the VISION families, built once per process in a temporary folder."""
    if family not in _built:
        root = Path(tempfile.mkdtemp(prefix=f"tiny-{family}-"))
        make = {"llava": build_llava, "gemma3": build_gemma3, "idefics3": build_idefics3,
                "smolvlm": lambda t: build_idefics3(t, family="smolvlm")}.get(
            family, lambda t: build(t, family=family))
        _built[family] = str(make(root / f"tiny-{family}"))
    return _built[family]


def tiny_qwen2_vl() -> str:
    """The fixture directory, built once per process in a temporary folder."""
    return tiny_vision("qwen2_vl")


def bench_qwen2_vl() -> str:
    """A wider random Qwen2-VL (width 384, 4 layers, images up to 448x448) where compute, not
    per-request overhead, dominates: the bench's default."""
    if "bench" not in _built:
        root = Path(tempfile.mkdtemp(prefix="bench-qwen2-vl-"))
        _built["bench"] = str(build(root / "bench-qwen2-vl", width=384, layers=4, max_pixels=448 * 448))
    return _built["bench"]


def image_b64(seed: int = 0, size=(160, 120), fmt="PNG") -> str:
    """A deterministic picture (blocks of colour from the seed), base64."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(6, 8, 3), dtype=np.uint8)
    img = Image.fromarray(blocks).resize(size, Image.NEAREST)
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return base64.b64encode(buf.getvalue()).decode()


if __name__ == "__main__":
    print(build(Path(os.environ.get("TARGET", tempfile.mkdtemp())) / "tiny-qwen2-vl"))


def video_b64(seed: int = 0, frames: int = 8, size=(112, 84), fps: int = 4) -> str:
    """A deterministic clip (a new block picture every frame) as MPEG-4, base64."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "clip.mp4")
        writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"mp4v"), fps, size)
        for _ in range(frames):
            blocks = rng.integers(0, 256, size=(6, 8, 3), dtype=np.uint8)
            writer.write(cv2.resize(blocks, size, interpolation=cv2.INTER_NEAREST))
        writer.release()
        with open(path, "rb") as f:
            return base64.b64encode(f.read()).decode()
