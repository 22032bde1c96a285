"""Recipes: Families whose vision towers mlx-vlm fixes in code, the tower kept at that size (seeded random
weights), everything else tiny.
"""

from zoo.recipes.base import Recipe, _add
from zoo.recipes.single_run import LLAVA_TEMPLATE
from zoo.vision_shrink import shrink


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
