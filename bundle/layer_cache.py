"""The artifact's interpreter with its packages, kept between builds.

Laying out the interpreter and installing the runtime packages is most of a build (about a
minute here) and depends only on the packages, the interpreter and the build scripts, not on
our sources. `provide(cache, key, dest, make)` fills `dest` with that layer: copied from the
store's `package-layers/python-<key>/` when an earlier build kept it, else made by `make(dest)`
and then kept.

What is kept is code that goes into every later artifact, so it is kept as the backend keeps
everything (store.py): in a folder of this user's alone, sealed with a manifest of every
entry's size and checksum (or a link's text) and verified before it is copied; a damaged layer
is removed and made anew. Only the newest layer is kept (about 1 GB each). A store that cannot
keep it (a full or read-only disk, another user's folder) is a miss: the build goes on, made
anew. An empty `cache` keeps nothing.
"""

import logging
import shutil
import sys
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "backend"))

import store  # noqa: E402  (the backend's own store, and its rules)

log = logging.getLogger("bundle")

PREFIX = "python-"


def default_root() -> str:
    """The store's folder for package layers (under MLX_BACKEND_CACHE_DIR, else the user's cache folder)."""
    return str(store.LAYERS.base())


def provide(cache: str, key: str, dest: Path, make: Callable[[Path], None]) -> bool:
    """`dest` holding the layer for `key`; True when it came from the cache. A copy out of the
    cache that fails (a full disk) fails the build; the kept layer stays."""
    if not cache:
        make(dest)
        return False
    name, meta = f"{PREFIX}{key}", {"layer": key}
    folder = store.LAYERS.folder(base=Path(cache))
    if folder is None:  # the fault is logged and counted by the store
        make(dest)
        return False
    with store.LAYERS.locked(folder, "layers"):  # one build reads or writes the cache at a time
        kept = store.LAYERS.open_folder(name, meta, base=folder)
        if kept is not None:
            store.copy_out(kept, dest)
            return True
        make(dest)
        store.LAYERS.make_folder(name, meta, lambda tmp: _copy(dest, tmp), base=folder, scratch=False)
    return False


def _copy(made: Path, tmp: Path) -> None:
    tmp.rmdir()  # copytree makes it, with the layer's own folder mode (sealed private after)
    shutil.copytree(made, tmp, symlinks=True)
