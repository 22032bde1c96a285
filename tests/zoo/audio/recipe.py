"""What a recipe of the audio matrix is: how one family's tiny model is made, and how it is asked.

A recipe module (stt_recipes.py, tts_recipes.py, vad_recipes.py) holds RECIPES (family ->
AudioRecipe) and NOT_BUILT (family -> why no tiny model of it is made here). `build` writes a
folder in mlx-audio's own layout (config.json, weights, the assets its loader and processor
read) that `mlx_audio.<kind>.utils.load_model` loads as it is; the builder (builder.py) seeds
MLX before calling it, so the weights are the same on every machine, and keeps the folder.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Tuple


@dataclass(frozen=True)
class AudioRecipe:
    family: str  # the package under mlx_audio/<kind>/models
    kind: str  # "stt", "tts" or "vad"
    build: Callable[[Path], None]  # writes the model's files into an empty folder
    # Keyword arguments of the family's own generate beyond the input, as a user would pass
    # them (JSON values): the same in the oracle's call and in the request to the server.
    generate: Dict[str, object] = field(default_factory=dict)
    # What the matrix sends: texts for "tts" (two that must give two different waveforms);
    # for "stt" and "vad", clips as (seed, seconds) of audio_clips.clip.
    inputs: Tuple = ()
    version: int = 1  # bump when what `build` writes changes
    note: str = ""  # what the matrix's table says of this family beside its result
