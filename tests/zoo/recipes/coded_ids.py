"""Recipes: Processors that write their image tokens' ids in code (DotsOCR, HunYuan-VL, Jina-VLM). The tiny
tokenizer reaches those ids (`fixed`, fillers below them: zoo/fixed_ids.py), so the embedding and the head have
120-150k rows; a text model _NARROW wide keeps each a few MB.
"""

from zoo.recipes.base import Recipe, _add, _qwen_preprocessor, _turns
from zoo.vision_shrink import WIDTH, shrink


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
