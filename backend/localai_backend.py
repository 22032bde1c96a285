#!/usr/bin/env python3
"""Lay out a LocalAI backend folder that runs this project.

    python backend/localai_backend.py DEST [--name mlx] [--alias ALIAS]

LocalAI looks for user-managed backends in its backends folder: one directory
per backend holding an executable `run.sh` (started with `--addr HOST:PORT`,
its own folder as working directory) and optionally `metadata.json`. This
writes DEST/NAME/run.sh, which starts this checkout's backend from any working
directory, and DEST/NAME/metadata.json; running it again updates both in place.
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import store

REPO = Path(__file__).resolve().parent.parent


def version() -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def layout(dest: str, name: str = "mlx", alias: str = "") -> Path:
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"backend name {name!r} must be a plain folder name")
    folder = Path(dest).expanduser().resolve() / name
    folder.mkdir(parents=True, exist_ok=True)
    run = folder / "run.sh"
    tmp = run.with_suffix(".tmp")
    tmp.write_text(
        "#!/bin/sh\n"
        f"# LocalAI backend {name!r}: the MLX backend checked out at {REPO}.\n"
        f"exec {shlex.quote(str(REPO / 'backend' / 'run.sh'))} \"$@\"\n")
    tmp.chmod(0o755)
    store.publish(tmp, run)  # a LocalAI starting it meanwhile sees one whole file
    meta = {"name": name, "version": version()}
    if alias:
        meta["alias"] = alias
    (folder / "metadata.json").write_text(json.dumps(meta, indent=2) + "\n")
    return folder


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", help="LocalAI's backends folder (LOCALAI_BACKENDS_PATH)")
    parser.add_argument("--name", default="mlx", help="the backend's name (default: mlx)")
    parser.add_argument("--alias", default="", help="another name models may use in `backend:`")
    args = parser.parse_args(argv)
    try:
        folder = layout(args.dest, args.name, args.alias)
    except ValueError as e:
        raise SystemExit(str(e))
    print(f"LocalAI backend {args.name!r} laid out in {folder}", file=sys.stderr)


if __name__ == "__main__":
    main()
