"""The audio families of the installed mlx-audio, by kind, and the reason a family has no tiny model.

A family is a package under `mlx_audio/<kind>/models` for the kinds this server serves (stt:
speech to text, tts: text to speech, vad: voice activity): the set the installed library
ships, read from its folders, not a list we keep. The recipe modules make what they can; every
other family carries the reason its recipe module gives (NOT_BUILT), or, for one a newer
mlx-audio adds, the bare "no recipe".
"""

import importlib
import importlib.util
import os
from typing import Dict, List

KINDS = ("stt", "tts", "vad")
_MODULES = {"stt": "zoo.audio.stt_recipes", "tts": "zoo.audio.tts_recipes", "vad": "zoo.audio.vad_recipes"}


def audio_families(kind: str) -> List[str]:
    """Every family package of `kind` in the installed mlx-audio, sorted."""
    root = os.path.join(os.path.dirname(importlib.util.find_spec("mlx_audio").origin), kind, "models")
    return sorted(n for n in os.listdir(root)
                  if not n.startswith("_") and os.path.isdir(os.path.join(root, n)))


def _module(kind: str):
    try:
        return importlib.import_module(_MODULES[kind])
    except ModuleNotFoundError as e:
        if e.name != _MODULES[kind]:
            raise
        return None


def recipes(kind: str) -> Dict[str, object]:
    module = _module(kind)
    return dict(getattr(module, "RECIPES", {})) if module else {}


def reason(kind: str, family: str) -> str:
    """Why `family` has no tiny model here ("" when it has one)."""
    module = _module(kind)
    if module and family in getattr(module, "RECIPES", {}):
        return ""
    return (getattr(module, "NOT_BUILT", {}) if module else {}).get(family, "no recipe")
