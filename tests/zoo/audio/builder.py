"""Tiny random-weight models of mlx-audio's families, built with mlx-audio's own classes.

Each recipe (recipe.py) writes a folder in the family's own layout; here it is built once per
machine into the test-model folder, under a name that carries a hash of the recipe's source,
its version and mlx-audio's version (a change to any builds anew), seeded from the family's
name, into a temporary folder renamed into place under the shared build lock.

`python tests/zoo/audio/builder.py [kind:family ...]` builds them and prints where.
"""

import hashlib
import inspect
import json
import os
import shutil
import sys
from pathlib import Path

if __name__ == "__main__":  # as a script: the folders conftest.py puts on the path
    _TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path[:0] = [os.path.join(os.path.dirname(_TESTS), "backend"), _TESTS]

from models import building, models_root  # noqa: E402

from zoo.audio.families import KINDS, recipes  # noqa: E402
from zoo.audio.recipe import AudioRecipe  # noqa: E402


def _name(recipe: AudioRecipe) -> str:
    from importlib import metadata

    module = sys.modules[recipe.build.__module__]
    text = json.dumps([recipe.kind, recipe.family, recipe.version, recipe.generate, list(recipe.inputs),
                       metadata.version("mlx-audio")], sort_keys=True, default=str)
    text += inspect.getsource(module)  # the recipe's code and the helpers beside it
    return f"{recipe.family}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


def build(kind: str, family: str, root: Path = None) -> str:
    """The folder of `family`'s tiny model, built once per machine. KeyError: no recipe."""
    import mlx.core as mx

    recipe = recipes(kind)[family]
    root = Path(root) if root is not None else models_root() / "audio-zoo" / kind
    target = root / _name(recipe)
    with building(target) as tmp:
        if not (target / "config.json").exists():
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            try:
                mx.random.seed(int(hashlib.sha256(f"{kind}:{family}".encode()).hexdigest()[:8], 16))
                recipe.build(tmp)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)  # nothing half-built is left in the folder
                raise
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
    return str(target)


if __name__ == "__main__":
    wanted = sys.argv[1:] or [f"{k}:{f}" for k in KINDS for f in sorted(recipes(k))]
    for item in wanted:
        kind, family = item.split(":")
        print(item, build(kind, family))
