"""Whether a model directory is a vision-language model (mlx-vlm's) or a text model (mlx-lm's).

Each library would load the other's models, wrongly (mlx-lm silently drops a Qwen2-VL
vision tower; mlx-vlm loads plain Llama directories), so the choice is made from the
directory's config.json: a `vision_config` says vision (at its top, or in a part a
wrapper model holds). A few families mlx-vlm ships keep
their vision part in the library's code, not in config.json (Falcon OCR projects pixel
patches straight into its text model; its patch size is a top-level field): those are
recognised by their model type, one mlx-lm has no model for and mlx-vlm has a vision
family for.
"""

import dataclasses
import importlib
import importlib.util
import json
import logging
from pathlib import Path

log = logging.getLogger("mlx-backend.loader")


def is_vision(path: Path) -> bool:
    cfg = path / "config.json"
    if not cfg.exists():
        return False
    try:
        config = json.loads(cfg.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    if not isinstance(config, dict):
        return False
    # At its top, or in a part a wrapper model holds (Qwen3-Omni keeps its tower's config in thinker_config).
    parts = [config] + [v for v in config.values() if isinstance(v, dict)]
    return (any(p.get("vision_config") for p in parts)
            or (not _text_library_knows(config) and _vision_family(config)))


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a model type that is no module name
        return False


def _text_library_knows(config: dict) -> bool:
    """Whether mlx-lm has a model for the config's type (under its own renames)."""
    from mlx_lm import utils

    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        return False
    archs = config.get("architectures") or ()
    archs = (archs,) if isinstance(archs, str) else archs
    remapped = getattr(utils, "MODEL_ARCHITECTURE_REMAPPING", {})
    types = {utils.MODEL_REMAPPING.get(model_type, model_type)}
    types |= {remapped[(model_type, a)] for a in archs if (model_type, a) in remapped}
    return any(_module_exists(f"mlx_lm.models.{t}") for t in types)


def _vision_family(config: dict) -> bool:
    """Whether mlx-vlm's model for the config's type has a vision part (its ModelConfig a
    vision_config), imported only here: a type mlx-lm does not know."""
    from mlx_vlm.utils import get_model_type

    try:
        model_type = get_model_type(config)
    except (AttributeError, TypeError):  # a model_type that is no string
        return False
    if not model_type or not _module_exists(f"mlx_vlm.models.{model_type}"):
        return False
    try:
        module = importlib.import_module(f"mlx_vlm.models.{model_type}")
        fields = {f.name for f in dataclasses.fields(module.ModelConfig)}
    except Exception as e:  # a family the installed mlx-vlm cannot import here: not a vision model we can load
        log.info("mlx-vlm's %s does not import here: %s: %s", model_type, type(e).__name__, e)
        return False
    return "vision_config" in fields
