"""Recipes: Families whose vision towers mlx-vlm fixes in code, the tower kept at that size (seeded random
weights), everything else tiny.
"""

from zoo.recipes.base import Recipe, _add, _turns
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


# ---- Phi-3-Vision (phi3_v): the CLIP ViT-L/14 tower at 336 pixels (24 layers, 1024 wide, ~303 M parameters; a class
# attribute of its VisionModel, the config's vision part not read), four neighbouring patch features concatenated and
# projected by a 2-layer GELU MLP, its own Phi-3 text model (sizes at the config's top level). Its processor
# (Phi3VProcessor) tiles a picture into 336-pixel crops, at most num_crops (preprocessor_config.json; 1 here, the
# least: one tile and the global view, 313 image tokens) and writes each image's tokens as -1 at <|image_1|>,
# the tag mlx-vlm's prompt writes before the question. ~18 s a picture here in float32 with OpenBLAS (bfloat16 ~200 s:
# its matmuls have no fast path on this CPU), so float32; a folder of 1.2 GB.

PHI3_TEMPLATE = _turns("{{ '<|' + message['role'] + '|>\\n' }}", "<|image_1|>", "<|end|>\\n", "<|assistant|>\\n")


def _phi3_v(m, ids, vocab):
    return {"model_type": "phi3_v", **shrink(m.ModelConfig, vocab_size=vocab), "vision_config": {},
            "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|end|>"]}


_add("phi3_v", Recipe(specials=["<|endoftext|>", "<|user|>", "<|assistant|>", "<|end|>"], eos="<|end|>",
                      template=PHI3_TEMPLATE, config=_phi3_v,
                      files={"preprocessor_config.json": {"num_crops": 1, "num_img_tokens": 144}}))
