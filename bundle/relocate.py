"""Make the tree movable, and prove it is: nothing in it may name the folder it was built in.

pip writes console scripts whose first line is `#!<absolute path of the interpreter>`; they
become small sh/Python polyglots that find the interpreter beside themselves instead. The
check follows what a mover breaks: an absolute build path in `run.sh`, `*.sh`, `*.cfg` or
`*.pth` files or in the first line of a file in a `bin/` folder, and symlinks that are
absolute or lead out of the tree.
"""

import os
from pathlib import Path

# `sh` runs the second line (Python reads it as a string): exec the interpreter that sits in
# the script's own folder, whatever the folder's name, spaces included.
POLYGLOT = (b"#!/bin/sh\n"
            b"'''exec' \"$(dirname -- \"$(realpath -- \"$0\")\")/python3\" \"$0\" \"$@\"\n"
            b"' '''\n")
CHECKED_SUFFIXES = (".sh", ".cfg", ".pth")


def rewrite_shebangs(bin_dir: Path, interpreter_dir: str) -> int:
    """Scripts in `bin_dir` whose `#!` names an interpreter under `interpreter_dir`: how many changed."""
    changed = 0
    for path in sorted(bin_dir.iterdir()):
        if path.is_symlink() or not path.is_file():
            continue
        with open(path, "rb") as f:
            first = f.readline()
        if not (first.startswith(b"#!") and interpreter_dir.encode() in first and b"python" in first):
            continue
        rest = path.read_bytes()[len(first):]
        mode = path.stat().st_mode
        path.write_bytes(POLYGLOT + rest)
        path.chmod(mode)
        changed += 1
    return changed


def _first_line(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.readline()


def problems(root: Path, forbidden) -> list:
    """What in the tree under `root` would break when it moves: one line each."""
    root = Path(root)
    needles = [p.encode() for p in forbidden if p]
    found = []
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            rel = path.relative_to(root)
            if path.is_symlink():
                target = os.readlink(path)
                inside = os.path.normpath(os.path.join(folder, target))
                if os.path.isabs(target) or not (inside + os.sep).startswith(str(root) + os.sep):
                    found.append(f"{rel}: symlink to {target} leaves the tree")
                continue
            if name in dirs:
                continue
            if name == "run.sh" or name.endswith(CHECKED_SUFFIXES):
                text = path.read_bytes()
            elif Path(folder).name == "bin":
                text = _first_line(path)
            else:
                continue
            for needle in needles:
                if needle in text:
                    found.append(f"{rel}: names {needle.decode()}")
    return found
