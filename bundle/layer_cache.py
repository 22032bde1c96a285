"""The artifact's interpreter with its packages, kept between builds.

Laying out the interpreter and installing the runtime packages is most of a build (about a
minute here) and depends only on the packages, the interpreter and the build scripts, not on
our sources. `provide(cache, key, dest, make)` fills `dest` with that layer: copied from
`cache/python-<key>/` when an earlier build stored it whole, else made by `make(dest)` and then
stored.

What is kept is code that goes into every later artifact, so it is private and verified: the
folder is the user's alone (a folder others can write to is not used), and a stored layer holds
a manifest of every entry (path, mode, size and SHA-256, or a link's text); the copy in `dest`
must match it, else the stored layer is dropped and made anew. A layer is written in a
`.partial-*` folder and renamed once complete, so a crash or a full disk leaves nothing a later
build would take; storing one removes the older ones (a layer is about 1 GB). An empty `cache`
keeps nothing.
"""

import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "backend"))

from loaders.private_files import private_dir  # noqa: E402  (the backend's own rule for its caches)

log = logging.getLogger("bundle")

PREFIX = "python-"


def default_root() -> str:
    """Beside the project's other caches (MLX_BACKEND_CACHE_DIR, else the user's cache folder)."""
    root = os.environ.get("MLX_BACKEND_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "localai-mlx")
    return os.path.join(root, "package-layers")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def manifest(root: Path) -> list:
    """[path, mode, size, sha256 or link text] of every entry under `root`, sorted by path."""
    entries = []
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                content = os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                content = _sha256(path)
            else:
                content = None
            entries.append([path.relative_to(root).as_posix(), st.st_mode, st.st_size if content else 0, content])
    return sorted(entries)


def _private(root: Path) -> bool:
    """`root` made as the backend makes its cache folders (0700, missing parents too); False for
    one another user owns or others could write to. Unlike the backend's caches, such a folder
    is not tightened and used: what it holds may already have been changed."""
    if os.path.lexists(root):
        st = root.stat()
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            log.warning("%s is not this user's alone (owner %d, mode %o): no layer is kept or taken from it",
                        root, st.st_uid, stat.S_IMODE(st.st_mode))
            return False
    private_dir(root)
    return True


def _take(stored: Path, dest: Path) -> bool:
    """Copy the stored layer into `dest`; False (and `dest` and the stored layer gone) when the
    copy does not match its manifest. A copy that fails (a full disk) fails the build."""
    try:
        recorded = json.loads((stored / "manifest.json").read_text())
    except (OSError, ValueError) as e:
        recorded, why = None, f"its manifest: {type(e).__name__}: {e}"
    if recorded is not None:
        shutil.copytree(stored / "layer", dest, symlinks=True)
        if manifest(dest) == recorded:
            return True
        why = "its files differ from its manifest"
    log.warning("the stored layer %s is damaged (%s): made anew", stored.name, why)
    shutil.rmtree(dest, ignore_errors=True)
    shutil.rmtree(stored, ignore_errors=True)
    return False


def _store(root: Path, stored: Path, made: Path) -> None:
    partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=root))
    try:
        shutil.copytree(made, partial / "layer", symlinks=True)
        (partial / "manifest.json").write_text(json.dumps(manifest(partial / "layer")))
        os.rename(partial, stored)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    for older in root.iterdir():
        if older != stored and older.name.startswith((PREFIX, ".partial-")):
            log.info("removing the older layer %s", older.name)
            shutil.rmtree(older, ignore_errors=True)


def provide(cache: str, key: str, dest: Path, make: Callable[[Path], None]) -> bool:
    """`dest` holding the layer for `key`; True when it came from the cache."""
    root = Path(cache) if cache else None
    if root is None or not _private(root):
        make(dest)
        return False
    stored = root / f"{PREFIX}{key}"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build reads or writes the cache at a time
        if stored.is_dir() and _take(stored, dest):
            return True
        make(dest)
        _store(root, stored, dest)
    return False
