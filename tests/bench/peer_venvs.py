"""Each peer server in a virtualenv of its own, outside the repository, installed on first use.

A peer's venv is ready once its marker file names exactly the packages asked for; a change
of pins (or a half-finished install) installs again. pip keeps its download cache, so a
second install of the same pins downloads nothing.
"""

import json
import logging
import os
import shutil
import subprocess
import sys
from typing import Optional, Sequence

log = logging.getLogger("bench-peers")

MARKER = "bench-peers-installed.txt"


def default_root() -> str:
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                        "localai-mlx", "bench-peers")


def folder_size(path: str) -> int:
    total = 0
    for top, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(top, name)).st_size
            except OSError:
                pass
    return total


def python_of(venv: str) -> str:
    return os.path.join(venv, "bin", "python")


def is_ready(venv: str, packages: Sequence[str]) -> bool:
    try:
        with open(os.path.join(venv, MARKER)) as f:
            return f.read().split() == list(packages) and os.path.exists(python_of(venv))
    except OSError:
        return False


def ensure(venv: str, packages: Sequence[str], log_path: str) -> Optional[str]:
    """The venv's python, installing the packages first when they are not there; None when pip fails
    (its output is in log_path)."""
    if is_ready(venv, packages):
        return python_of(venv)
    log.info("installing %s into %s (first run only; pip's output goes to %s)", " ".join(packages), venv, log_path)
    shutil.rmtree(venv, ignore_errors=True)  # a half-done or differently pinned install
    os.makedirs(os.path.dirname(venv), exist_ok=True)
    with open(log_path, "ab") as out:
        # The venv's base is the interpreter running the bench (its own Python, not a system one).
        base = getattr(sys, "_base_executable", sys.executable)
        for cmd in ([base, "-m", "venv", venv], [python_of(venv), "-m", "pip", "install", *packages]):
            if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                return None
    with open(os.path.join(venv, MARKER), "w") as f:
        f.write("\n".join(packages) + "\n")
    log.info("installed %s: %.1f GB on disk", venv, folder_size(venv) / 1e9)
    return python_of(venv)


VERSIONS_OF = ("mlx", "mlx-cpu", "mlx-lm", "mlx-vlm", "transformers", "torch", "vllm-mlx", "rapid-mlx")
_VERSIONS = """
import importlib.metadata as m, json, sys
found = {}
for name in sys.argv[1:]:
    try:
        found[name] = m.version(name)
    except m.PackageNotFoundError:
        pass
print(json.dumps(found))
"""


def versions(python: str) -> dict:
    """What pip resolved in a venv, for the record (the pins leave mlx-lm and torch to pip)."""
    out = subprocess.run([python, "-c", _VERSIONS, *VERSIONS_OF], capture_output=True, text=True)
    return json.loads(out.stdout) if out.returncode == 0 else {}
