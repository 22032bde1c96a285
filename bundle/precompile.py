"""Byte-code for what the server imports, not for every installed module.

pip would compile all of site-packages: a fifth of the artifact's size and most of its build
time, for modules (pyarrow, pandas, OpenCV, SciPy, ...) that a server start never imports.
Instead the bundled interpreter imports, once, every module our code names (at the top and
inside functions alike: read with `ast`), and Python writes the byte-code of exactly that
closure. A module imported later (a model family's file) is compiled when first used.
"""

import ast
import json
import shutil
import subprocess
from pathlib import Path

# Run by the bundled interpreter in the tree, with sys.path as backend/backend.py sets it (and
# common/ too: its modules import each other flat, as LocalAI's backends load them).
WARM = """
import importlib, json, sys
sys.path[:0] = ["backend", ".", "common"]
failed = []
for module, names in json.loads(sys.argv[1]):
    try:
        loaded = importlib.import_module(module)
        for name in names:
            getattr(loaded, name, None)  # lazy packages (transformers) import on attribute access
    except Exception as e:  # noqa: BLE001 - a module that cannot load here is compiled when used
        failed.append(f"{module}: {type(e).__name__}")
print("\\n".join(failed))
"""


def imports_of(files) -> list:
    """[(module, [names])] of every absolute import in `files`, in a stable order."""
    found = {}
    for path in files:
        tree = ast.parse(Path(path).read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    found.setdefault(alias.name, set())
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.setdefault(node.module, set()).update(a.name for a in node.names if a.name != "*")
    return [(module, sorted(names)) for module, names in sorted(found.items())]


def warm(python: Path, tree: Path, sources, env: dict) -> list:
    """Import what `sources` (files under `tree`) import; the modules that failed to."""
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run([str(python), "-c", WARM, json.dumps(imports_of(sources))], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=600, check=True)
    for folder in ("backend", "common"):  # our own byte-code stays out of the artifact
        for cache in list((tree / folder).rglob("__pycache__")):
            shutil.rmtree(cache)
    return [line for line in done.stdout.splitlines() if line]
