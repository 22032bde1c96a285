"""The vision families' recipes, a module a group (zoo/vision_recipes.py gathers them)."""
