"""The vision-language families of the installed mlx-vlm, and why the builder makes none of some.

A family is a package of `mlx_vlm.models` with a `Model` and a config that has a vision part
(a `VisionConfig`, a `vision_config` field): the set the installed library ships, not a
list we keep. vision_recipes.py makes the families it can tiny; every other family is
listed with the reason, read from the library's source: LIBRARY_CANNOT (what the installed
library lacks here: a processor only the Hub has, a package not installed), NOT_BUILT (not a
text generator, a weights format the builder does not write, a vision tower the library fixes
at a size no matrix case can afford, with its measured cost), FULL_TOWERS (built with such a
tower where a case takes a minute or more: checked when asked, not in `make test`). A family in none of
them (one a newer mlx-vlm adds) gets the bare "no recipe" reason, and the matrix says so.
"""

import importlib.util
import os
import re
from pathlib import Path
from typing import List

# What marks a family in a model package's source: a Model (defined or imported) and a vision config.
_MODEL = re.compile(r"^class Model\b|^Model\s*=|\bimport\b[^\n]*\bModel\b", re.M)
_VISION = re.compile(r"\bVisionConfig\b|^\s+vision_config\s*:", re.M)


def vision_families() -> List[str]:
    """Every vision-language family package of the installed mlx-vlm, sorted. Read from the
    packages' source, not imported: importing some 270 model packages takes most of a minute,
    and every pytest run collects the test that asks."""
    root = os.path.join(os.path.dirname(importlib.util.find_spec("mlx_vlm").origin), "models")
    found = []
    for name in sorted(os.listdir(root)):
        folder = os.path.join(root, name)
        if name.startswith("_") or not os.path.isdir(folder):
            continue
        source = "".join(Path(folder, f).read_text(encoding="utf-8", errors="replace")
                         for f in os.listdir(folder) if f.endswith(".py"))
        if _MODEL.search(source) and _VISION.search(source):
            found.append(name)
    return found


_NOT_TEXT = "not a text generator: mlx-vlm serves it for {} (no chat generation to compare)"

# Families the builder does not make, and why.
NOT_BUILT = {
    # Models that do not generate text from an image and a prompt.
    "siglip": _NOT_TEXT.format("image-text embeddings"),
    "colidefics3": _NOT_TEXT.format("retrieval embeddings (ColPali)"),
    "colqwen2_5": _NOT_TEXT.format("retrieval embeddings (ColPali)"),
    "qwen3_vl_embedding": _NOT_TEXT.format("embeddings"),
    "llama_nemotron_vl_embedding": _NOT_TEXT.format("embeddings"),
    "embedding_gemma2": _NOT_TEXT.format("embeddings"),
    "sam3": _NOT_TEXT.format("segmentation"),
    "sam3_1": _NOT_TEXT.format("segmentation"),
    "sam3d_body": _NOT_TEXT.format("3-D body estimation"),
    "sam3d_objects": _NOT_TEXT.format("3-D object reconstruction"),
    "rfdetr": _NOT_TEXT.format("object detection"),
    "rt_detr_v2": _NOT_TEXT.format("object detection"),
    "pp_doclayout_v3": _NOT_TEXT.format("document layout detection"),
    "video_depth_anything": _NOT_TEXT.format("depth estimation"),
    "d1": _NOT_TEXT.format("decisions (a readout over LFM2-VL)"),
    "d1_omni": _NOT_TEXT.format("yes/no decisions"),
    "clef": _NOT_TEXT.format("answers to choice and score questions (a schema head over Qwen 3.5, called with "
                             "question and option spans)"),
    # Text by diffusion: no token-by-token generation for a batch or a stream to reproduce.
    "diffusion_gemma": "generates text by diffusion, not one token a step: nothing this server runs",
}


# Families built with a vision tower mlx-vlm fixes at its full size in code: a case takes a minute or more, over
# `make test`'s budget, so the matrix builds and checks them only when asked, with ZOO_FULL_TOWERS=1 (as
# `make families-doc` runs it) or by name in FAMILIES. Measured here with the OpenBLAS the server and the oracle
# preload (seeded random weights, the shared 2-core CPU).
FULL_TOWERS = {
    # Both crops of a picture (its one 336-pixel tile and the global view) through the tower: 17.7-18.0 s in float32,
    # 213-219 s in bfloat16; a case encodes some 10 pictures (the oracle's 2, then alone, two at once, stream, repeat).
    "phi3_v": "its CLIP ViT-L/14 tower is fixed in mlx-vlm's code (24 layers, 1024 wide, 303.5M parameters, 1.2 "
              "GB in float32): ~18 s a picture here, some 10 pictures a case",
    # 294.1M parameters (a folder of 1.2 GB in float32); the smallest picture it takes is 256 pixels (stage 3 at
    # 16x16, the fusion adapter's output; at 64 its resize branch fails: rms_norm2d "[broadcast_shapes] Shapes
    # (1,16,2048,16) and (1,2048,1,1)"); one forward at 256 pixels: 3.5-4.1 s in float32; a case ~1 min.
    "gemma3n": "its MobileNet-V5 tower is fixed in mlx-vlm's code (gemma3n_mobilenet_def: 4 stages of 128 to 1280"
               " filters, some 80 blocks, a 2048-wide fusion adapter; 294.1M parameters, 1.2 GB in float32): ~4 s"
               " a picture here at its smallest (256 pixels), ~1 min a case",
    # DeepSeek-OCR's SAM tower is built from SAMViTConfig()'s defaults whatever the config says (ViT-B: 12 layers of
    # width 768, 95.6M parameters with its neck), and its processors pad every picture's global view to base_size
    # 1024 pixels (a call argument every caller leaves at its default; no processor file sets it): 4096 patches
    # through it, 36-38 s a picture in float32. A case encodes some 13 pictures (the oracle's 2, LoadModel's check,
    # then alone, two at once, stream, repeat): 8.6 min for deepseekocr, 9.2 min for unlimited_ocr.
    "deepseekocr": "its SAM tower is fixed in mlx-vlm's code at ViT-B size (SAMViTConfig() defaults, not the "
                   "config's: 95.6M parameters) and its processor pads every picture to 1024 pixels (4096 "
                   "patches): ~37 s a picture here, ~9 min a case",
    # DeepSeek-OCR 2's processor also cuts every picture into 768-pixel crops by its aspect ratio, one at least and up
    # to six (the test's 4:3 and 3:4 pictures: six), each through SAM and its 24-layer Qwen2 encoder (its config's
    # from_dict fixes the layers; ~360M parameters): 385 s for the oracle's two pictures, 22 min a case.
    "deepseekocr_2": "DeepSeek-OCR's SAM ViT-B tower (96M parameters) and a Qwen2 encoder fixed at 24 layers of "
                     "width 896 (~360M), both in mlx-vlm's code, over the 1024-pixel global view and up to six "
                     "768-pixel crops a picture: ~190 s a picture here, ~22 min a case",
    "unlimited_ocr": "DeepSeek-OCR's towers and processor: its SAM tower is fixed in mlx-vlm's code at ViT-B size"
                     " (95.6M parameters) and every picture is padded to 1024 pixels: ~37 s a picture here, ~9 "
                     "min a case",
}
# Each says how to have it checked.
FULL_TOWERS = {family: f"{why}; checked when asked (ZOO_FULL_TOWERS=1, as make families-doc runs, or "
                       f"FAMILIES={family}), not in make test" for family, why in FULL_TOWERS.items()}


# Families the installed library cannot run here: what is missing.
LIBRARY_CANNOT = {
    # Found with the recipe built (vision_recipes: deepseek_vl_v2), one process, mlx-vlm's stream_generate, greedy:
    # pictures 2, 1, 2 give [226, 360, ...], [360, 326, ...], then [10, 157, ...]; pictures 1, 2, 1 give [360, ...],
    # [226, ...], then [10, 205, ...]. Its processor's outputs and its embedding step's output are the same on
    # every call (checked four times over), so the state is in the generation path, not the model's inputs.
    "deepseek_vl_v2": "mlx-vlm's own greedy answer for a picture changes at the third generation in a process "
                      "(the same picture first and third: [226, 360, ...] then [10, 157, ...]; the processor's "
                      "outputs and the embedding step's are the same on every call), so there is no stable answer "
                      "to serve; our server gives the answers of the library's first generations",
    "moondream2": "its processor (Moondream2Processor) always loads its tokenizer from the Hub repository "
                  "moondream/starmie-v1, and no model hub is reachable here",
    "mistral_large3": "mlx-vlm puts no image in its prompt (no mistral_large3 entry in prompt_utils' formats) and "
                      "ships no processor for it: its checkpoints carry Mistral's params.json and tekken.json, "
                      "read by mistral-common, which is not installed",
    "youtu_vl": "mlx-vlm ships no processor for it and transformers has none (models/youtu is text only): its "
                "processor is the checkpoint's own code (trust_remote_code, from the Hub)",
    "llmjpvl": "mlx-vlm ships no processor for it and transformers has none: its processor is the checkpoint's "
               "own code (trust_remote_code, from the Hub)",
    # Found by building its model tiny and running its text model once (the same wall as mlx-lm's muse_spark).
    "muse_spark": "its text model (mlx_vlm.models.muse_spark.language) calls mlx-vlm's fused kernels "
                  "(mlx_vlm.kernels: qk_norm_rope, qk_norm, rms_norm_sigmoid_gate, expert_routing, norm_add_norm, "
                  "pre_norm, post_expert_norm_combine, each an mx.fast.metal_kernel) with no other path: on the CPU "
                  "its first attention raises \"RuntimeError: [metal_kernel] No Metal back-end.\" (its vision "
                  "tower uses none)",
    # Found by building it tiny (a NaFlex tower named in mm_vision_tower) and asking the library.
    "phi4_siglip": "its processor (Phi4SigLipProcessor) makes the NaFlex image processor from transformers' "
                   "image_processing_siglip2, which imports torch (not installed here); its fallback is the "
                   "checkpoint's own processor from the Hub, and mlx-vlm's loader, on that failure, silently "
                   "returns the bare tokenizer: the image is dropped (no pixel values), so its text ignores it",
}


def reason(family: str) -> str:
    return (LIBRARY_CANNOT.get(family) or NOT_BUILT.get(family) or FULL_TOWERS.get(family)
            or "no recipe for its tokenizer and processor files yet")


def built_here(family: str, named: List[str]) -> bool:
    """Whether the matrix builds `family` in this run: it has a recipe, and a full-size tower only when asked
    (ZOO_FULL_TOWERS=1, or `named` in FAMILIES)."""
    from zoo.vision_recipes import RECIPES

    asked = os.environ.get("ZOO_FULL_TOWERS") == "1" or family in named
    return family in RECIPES and (family not in FULL_TOWERS or asked)
