"""How each vision-language family is made tiny: its tokens, chat template, config and
processor files.

A recipe is data plus one function from the trained tokenizer's ids to config.json;
everything about sizes comes from the generic shrink (vision_shrink.py) and only what a
family's own code insists on is written here. mlx-vlm's processors read the files named
in `files` (most families' processors are mlx-vlm's own, chosen by config.json's
model_type).

The recipes live in zoo/recipes/, a module a group of families (recipes/base.py holds the
Recipe itself and the Qwen-VL families); each module adds its families to RECIPES when
imported, in the order below, which is the matrix's order.
"""

from zoo.recipes.base import RECIPES, Recipe, module_of
from zoo.recipes import (  # noqa: F401  (imported for the families they add)
    single_run, tiled, descendants, newer, omni, own_tokens, minicpm, encoder_decoder, coded_ids, fixed_towers, packed,
)

__all__ = ["RECIPES", "Recipe", "module_of"]
