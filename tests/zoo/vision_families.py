"""The vision-language families of the installed mlx-vlm, and why the builder makes none of some.

A family is a package of `mlx_vlm.models` with a `Model` and a config that has a vision part
(a `VisionConfig`, a `vision_config` field): the set the installed library ships, not a
list we keep. vision_recipes.py makes the families it can tiny; every other family is
listed in NOT_BUILT with the reason, or, when no reason is written down, `reason()` says
only that no recipe exists yet.
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
    # Processors whose token ids are fixed in their code, past what a tiny vocabulary holds.
    "dots_ocr": "its processor fixes the image token's id at 151665: a tiny vocabulary cannot hold it",
    # Text by diffusion: no token-by-token generation for a batch or a stream to reproduce.
    "diffusion_gemma": "generates text by diffusion, not one token a step: nothing this server runs",
}


def reason(family: str) -> str:
    return NOT_BUILT.get(family, "no recipe for its tokenizer and processor files yet")
