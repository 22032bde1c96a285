"""The vision-language families of the installed mlx-vlm, and why the builder makes none of some.

A family is a package of `mlx_vlm.models` with a `Model` and a config that has a vision part
(a `VisionConfig`, a `vision_config` field): the set the installed library ships, not a
list we keep. vision_recipes.py makes the families it can tiny; every other family is
listed with the reason, read from the library's source: LIBRARY_CANNOT (what the installed
library lacks here: a processor only the Hub has, a package not installed), NOT_BUILT (not a
text generator, a weights format the builder does not write, and NOT_YET: the processor and
parts a recipe would need). A family in none of them gets the bare "no recipe" reason.
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
    # A tower whose size the model code fixes, not the config.
    "deepseekocr": "its SAM tower is built from SAMViTConfig()'s defaults whatever the config says (ViT-B: 12 "
                   "layers of width 768 at 1024 pixels, some 90M parameters): no tiny model can be built",
    "deepseekocr_2": "DeepSeek-OCR's fixed full-size SAM tower (SAMViTConfig() defaults, not the config's): no "
                     "tiny model can be built",
    "unlimited_ocr": "DeepSeek-OCR's model, with its fixed full-size SAM tower (SAMViTConfig() defaults, not the "
                     "config's): no tiny model can be built",
    # Measured at full size (the tower at its fixed size, seeded random weights, the rest tiny).
    "phi3_v": "its CLIP tower is fixed in mlx-vlm's code (VisionModel.CLIP_VIT_LARGE_PATCH14_336_CONFIG: 24 layers, "
              "1024 wide, 336-pixel crops, 303.5M parameters: 1.2 GB in float32, 0.6 GB in bfloat16; the config's "
              "vision part is not read). The processor takes num_crops 1 (preprocessor_config.json), the least: a "
              "picture is then one 336-pixel tile and the global view, 313 image tokens, 2 crops through 24 "
              "layers. On this CPU one layer on one crop takes 16-20 s in float32, 8-9 s in bfloat16, so ~400 s a "
              "picture at best (2 crops in either dtype did not finish in 300 s): far over a matrix case's ~40 s, "
              "so no recipe is kept",
    # Text by diffusion: no token-by-token generation for a batch or a stream to reproduce.
    "diffusion_gemma": "generates text by diffusion, not one token a step: nothing this server runs",
    # A weights format the builder does not write.
    "prism_hadamard_qwen35": "Qwen 3.5 as 2-bit Hadamard-rotated packs only (its config refuses any other "
                             "quantization and wants a packed-module manifest); the builder writes float weights",
}

_OWN = "mlx-vlm's own processor {} ({}); no tiny recipe built here yet"
_HF = "transformers' {} ({}); no tiny recipe built here yet"

# Families the installed library can run, for which no tiny model is built yet: what each needs.
NOT_YET = {
    "gemma3n": "its MobileNet-V5 tower is fixed in mlx-vlm's code (gemma3n_mobilenet_def: 4 stages of 128 to 1280 "
               "filters, some 80 blocks, a 2048-wide fusion adapter; no config field sizes it), so no config makes "
               "it tiny; Gemma3nProcessor, audio features, per-layer inputs; not built here",
}
NOT_BUILT.update(NOT_YET)

# Families the installed library cannot run here: what is missing.
LIBRARY_CANNOT = {
    "deepseek_vl_v2": "mlx-vlm's own greedy answer for a picture depends on what it generated before in the same "
                      "process (tiny model, recipe built: picture 2 alone gives [226, 360, ...], after picture 1 "
                      "[10, 157, ...]; the weights are unchanged), so there is no stable answer to serve; suspected: "
                      "state kept between generations in its DeepSeek-VL2 image path, not found yet",
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
    return LIBRARY_CANNOT.get(family) or NOT_BUILT.get(family, "no recipe for its tokenizer and processor files yet")
