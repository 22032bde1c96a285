"""Which model_types the installed mlx-lm ships: the text matrix's family set.

Read from the installed package's files, not imported (pytest collects the matrix's cases
from this list, and collecting must not load MLX or 130 model modules): every module under
mlx_lm/models that defines both `Model` and `ModelArgs`, plus every name mlx-lm remaps onto
one of them (MODEL_REMAPPING in mlx_lm/utils.py, e.g. mistral -> llama).
"""

import ast
import importlib.util
import re
from functools import lru_cache
from pathlib import Path


def _package() -> Path:
    spec = importlib.util.find_spec("mlx_lm")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("mlx-lm is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def _defines_model(source: str) -> bool:
    return all(re.search(rf"^class {name}\b", source, re.M) for name in ("Model", "ModelArgs"))


@lru_cache(maxsize=None)
def remapping() -> dict:
    """mlx-lm's MODEL_REMAPPING: model_type -> the module that implements it."""
    tree = ast.parse((_package() / "utils.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "MODEL_REMAPPING" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


@lru_cache(maxsize=None)
def families() -> tuple:
    """Every model_type the installed mlx-lm can be asked to load, sorted."""
    modules = {p.stem for p in (_package() / "models").glob("*.py") if _defines_model(p.read_text())}
    aliases = {name for name, target in remapping().items() if target in modules}
    return tuple(sorted(modules | aliases))


def module_of(family: str) -> str:
    """The mlx_lm.models module that implements `family`."""
    return remapping().get(family, family)


def version() -> str:
    """The installed mlx-lm's version, read from its metadata (no import)."""
    from importlib.metadata import version as dist_version

    return dist_version("mlx-lm")
