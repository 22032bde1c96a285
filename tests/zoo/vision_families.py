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
    "cohere_compass": _OWN.format("CohereCompassProcessor", "its own image processor, a Cohere text model"),
    "falcon_ocr": _OWN.format("FalconOCRProcessor", "transformers' PPDocLayoutV3 image processor; torch, not "
                                                              "installed, only for its optional layout stage"),
    "falcon_perception": _OWN.format("FalconPerceptionProcessor", "an AnyUp upsampler, detection outputs"),
    "fastvlm": "its FastViTHD tower's depths and widths are fixed in mlx-vlm's code (class attributes, not config "
               "fields: 44 blocks, 96 to 1536 wide), so no config makes it tiny; FastVLMProcessor, a Qwen2 text "
               "model; not built here",
    "florence2": _OWN.format("Florence2Processor", "a DaViT tower, a BART encoder-decoder"),
    "gemma3n": "its MobileNet-V5 tower is fixed in mlx-vlm's code (gemma3n_mobilenet_def: 4 stages of 128 to 1280 "
               "filters, some 80 blocks, a 2048-wide fusion adapter; no config field sizes it), so no config makes "
               "it tiny; Gemma3nProcessor, audio features, per-layer inputs; not built here",
    "gemma4_unified": _OWN.format("Gemma4UnifiedProcessor", "the Gemma 4 text model, its own image and audio parts"),
    "glm5_next": _OWN.format("Glm5NextProcessor", "its own tower, a GLM-5 text model"),
    "inkling": _OWN.format("InklingProcessor", "with mlx-audio for its audio features"),
    "kimi_k3": _OWN.format("KimiK3Processor", "a 3-D MoonViT, a Kimi Linear text model; tiktoken only for "
                                              "legacy tiktoken.model checkpoints"),
    "locateanything": _OWN.format("LocateAnythingProcessor", "MoonViT, a Qwen2 text model, box outputs"),
    "mimo_v2": _OWN.format("MiMoV2Processor", "with mlx-audio's audio tokenizer for audio"),
    "minicpmo": _OWN.format("MiniCPMOProcessor", "SigLIP slices, Whisper audio, a Qwen3 text model"),
    # Tried: a tiny build (2-layer SigLIP tower merged 16x, a Qwen 3.5 text model, 224-pixel images, no slices)
    # that mlx-vlm runs with the image changing its text. Our server refuses its images ("the prompt has no
    # place for them"): its config names no image token, and the processor fills each image's span with its
    # image_token_id (<|image_pad|>). Taking that id as the media token let it load, but the served text then
    # ignored the image: the processor's per-image outputs are lists (pixel_values, tgt_sizes, image_bound),
    # and prepare/vision.py _expand keeps only arrays, so the embedding step never saw the image.
    "minicpmv4_6": "MiniCPMVProcessor (mlx-vlm's own; image slices, a Qwen 3.5 text model): a tiny build runs in the "
                   "library, but our server cannot serve it yet: its config names no image token (the processor "
                   "fills each image with its image_token_id), and the processor's per-image outputs are lists "
                   "(pixel_values, tgt_sizes, image_bound), which prepare/vision.py's _expand drops (it keeps "
                   "arrays only); not in the matrix until both are handled",
    "minicpmv4_7": _OWN.format("MiniCPMV4_7Processor", "image slices, a Qwen 3.5 MoE text model; built on MiniCPM-V "
                                                       "4.6's processing code, so its server gap (see minicpmv4_6) "
                                                       "is expected here too"),
    "minimax_m3_vl": _OWN.format("MiniMaxM3VLProcessor", "a CLIP tower, a MiniMax-M3 text model"),
    "molmo": _OWN.format("MolmoProcessor", "image crops, its own text model"),
    "molmo2": _OWN.format("Molmo2Processor", "image crops and pooling, its own text model"),
    "molmo_point": _OWN.format("MolmoPointProcessor", "Molmo 2 with point outputs"),
    "moondream3": _OWN.format("Moondream3Processor", "its own crops, a MoE text model"),
    "muse_glimmer": _OWN.format("MuseGlimmerProcessor", "its own tower and text model"),
    "muse_spark": _OWN.format("MuseSparkProcessor", "image, video and audio parts"),
    "nemotron_h_nano_omni": _OWN.format("NemotronHNanoOmniProcessor", "a RADIO tower, Parakeet audio, a Nemotron-H "
                                                                      "hybrid text model"),
    "nemotron_parse": _OWN.format("NemotronParseProcessor", "an encoder-decoder for document markup"),
    "phi3_v": "its CLIP tower is fixed in mlx-vlm's code (VisionModel.CLIP_VIT_LARGE_PATCH14_336_CONFIG: 24 layers, "
              "1024 wide, 336-pixel crops, 144 tokens a crop; the config's vision part is not read), so no config "
              "makes it tiny; Phi3VProcessor, a Phi-3 text model; not built here",
    "qwen3_omni_moe": _OWN.format("Qwen3OmniMoeProcessor", "Qwen 3 vision, audio encoder, talker"),
    "qwen4_exp": "Qwen3VLProcessor (mlx-vlm's own); an experimental text model (n-gram per-layer embeddings, "
                 "a sparse indexer, multi-token prediction); no tiny recipe built here yet",
    "step3p7": _OWN.format("Step3VLProcessor", "a Perception Encoder tower, a Step 3.5 MoE text model"),
    "zaya1_vl": _OWN.format("Zaya1VLProcessor", "the Qwen-VL image processor, a ZAYA1 text model (compressed "
                                                "convolutional attention, MoE)"),
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
    # Found by building it tiny (a NaFlex tower named in mm_vision_tower) and asking the library.
    "phi4_siglip": "its processor (Phi4SigLipProcessor) makes the NaFlex image processor from transformers' "
                   "image_processing_siglip2, which imports torch (not installed here); its fallback is the "
                   "checkpoint's own processor from the Hub, and mlx-vlm's loader, on that failure, silently "
                   "returns the bare tokenizer: the image is dropped (no pixel values), so its text ignores it",
}


def reason(family: str) -> str:
    return LIBRARY_CANNOT.get(family) or NOT_BUILT.get(family, "no recipe for its tokenizer and processor files yet")
