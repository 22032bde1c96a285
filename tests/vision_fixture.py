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


def train_tokenizer(target: Path, specials=SPECIALS, template=CHAT_TEMPLATE, eos="<|im_end|>",
                    pad="<|endoftext|>", **named):
    """A byte-level BPE trained here on CORPUS, `specials` first in its vocabulary (all but the
    first are additional special tokens), saved with `template` into `target`; `named`: more
    named special tokens (bos_token=...)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=pad,
                                   additional_special_tokens=specials[1:], **named)
    fast.chat_template = template
    fast.save_pretrained(str(target))
    if template is not None:  # None: a checkpoint that ships no chat template (GOT-OCR's)
        (target / "chat_template.jinja").write_text(template)
    return fast


def turn_template(turn: str, image: str, end: str, answer: str, video: str = "", audio: str = "") -> str:
    """A chat template written for these tests: each turn `turn` (the role in it), images as
    `image`, videos as `video`, audio clips as `audio` (none rendered when empty), then `end`; the
    generation prompt `answer`."""
    heard = "{% elif part['type'] == 'audio' %}{{ '" + audio + "' }}" if audio else ""
    return ("{% for message in messages %}" + turn +
            "{% if message['content'] is string %}{{ message['content'] }}"
            "{% else %}{% for part in message['content'] %}"
            "{% if part['type'] == 'image' or 'image' in part %}{{ '" + image + "' }}"
            "{% elif part['type'] == 'video' %}{{ '" + video + "' }}" + heard +
            "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
            "{% endfor %}{% endif %}"
            "{{ '" + end + "' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '" + answer + "' }}{% endif %}")


def _save_random(target: Path, config: dict, scale: float) -> Path:
    """mlx-vlm's own model class for `config`, seeded random weights, matrices scaled by `scale`."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.utils import get_model_and_args

    (target / "config.json").write_text(json.dumps(config, indent=1))
    module, _ = get_model_and_args(config)
    model_config = module.ModelConfig.from_dict(config)
    model_config.text_config = module.TextConfig.from_dict(config)
    model_config.vision_config = module.VisionConfig.from_dict(config["vision_config"])
    mx.random.seed(0)
    model = module.Model(model_config)
    weights = {k: v * scale if v.ndim >= 2 else v for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(target / "model.safetensors"), weights)
    return target


# The vision families a user may load, as the tests build them (tiny_vision).
FAMILIES = ["qwen2_vl", "qwen2_5_vl", "idefics3", "smolvlm"]


def build(target: Path, width: int = 32, layers: int = 2, max_pixels: int = 12544) -> Path:
    """A Qwen2-VL directory; the defaults make the tests' 0.4 MB model, larger ones the bench's."""
    target.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(target)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIALS}
    config = {
        "model_type": "qwen2_vl", "architectures": ["Qwen2VLForConditionalGeneration"],
        "hidden_size": width, "intermediate_size": 2 * width, "num_hidden_layers": layers,
        "num_attention_heads": 2,
        "num_key_value_heads": 1, "vocab_size": len(tok), "tie_word_embeddings": True,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [width // 8, width // 16, width // 16]},
        "image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"],
        "eos_token_id": ids["<|im_end|>"], "bos_token_id": ids["<|endoftext|>"],
        "vision_config": {"model_type": "qwen2_vl", "depth": layers // 2, "embed_dim": width, "num_heads": 2,
                          "mlp_ratio": 2, "hidden_size": width, "patch_size": 14, "spatial_merge_size": 2,
                          "temporal_patch_size": 2, "in_channels": 3},
    }
    (target / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2VLProcessor",
        "min_pixels": 3136, "max_pixels": max_pixels, "patch_size": 14, "temporal_patch_size": 2,
        "merge_size": 2, "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711], "do_resize": True, "do_rescale": True,
        "do_normalize": True, "do_convert_rgb": True}, indent=1))
    # At the default init scale every image gives the same constant output; 4x the
    # matrices makes the greedy text depend on the image and on the prompt.
    return _save_random(target, config, 4.0)


_built = {}


def tiny_vision(family: str) -> str:
    """A tiny model of a vision family: this file's Qwen2-VL, built once per process in a temporary
    folder; any other, the zoo's (zoo/vision_builder.py, built once per machine)."""
    if family != "qwen2_vl":
        from zoo.vision_builder import build as zoo_build

        return zoo_build(family)
    if family not in _built:
        root = Path(tempfile.mkdtemp(prefix=f"tiny-{family}-"))
        _built[family] = str(build(root / f"tiny-{family}"))
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
