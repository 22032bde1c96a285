"""GGUF files as mlx-lm model directories, converted once and kept.

A GGUF file is converted (gguf_convert) into a plain mlx-lm directory kept in the
store (store.py: `gguf/<key>/`, private, sealed with every file's checksum, verified
at every load before mlx-lm reads it); mlx-lm's own loader then loads that directory
like any other, so the detokenizer, chat template, tool parser and thinking markers are
inferred by the same code for both kinds of model. This module says when a kept
conversion is still the one for a source file, and how two processes share one: the
conversion runs under a per-key lock, and the waiter takes the result. When the store
cannot keep it (a root that is a file, a read-only or full disk), the file is converted
into a scratch folder of this process's and the load goes on.
"""

import contextlib
import hashlib
import logging
import os
import time
from pathlib import Path
from typing import Any, Dict

import store
from loaders.gguf_convert import CONVERTER_VERSION, convert

log = logging.getLogger("mlx-backend.gguf")

_EDGE_BYTES = 1 << 16  # head and tail hashed into the identity


def source_identity(path: str) -> Dict[str, Any]:
    """What says "this is still the file that was converted".

    ctime cannot be set by a user: `cp -p` over the file keeps size, inode and
    mtime (to the nanosecond) but moves ctime; the head+tail hash catches
    filesystems with coarse or unreliable ctime.
    """
    st = os.stat(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(_EDGE_BYTES))
        if st.st_size > _EDGE_BYTES:
            f.seek(max(_EDGE_BYTES, st.st_size - _EDGE_BYTES))
            h.update(f.read(_EDGE_BYTES))
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "inode": st.st_ino,
            "device": st.st_dev, "edges_sha256": h.hexdigest(), "converter": CONVERTER_VERSION}


def cache_key(real_path: str) -> str:
    return hashlib.sha256(f"{real_path}|{CONVERTER_VERSION}".encode()).hexdigest()[:24]


def gguf_to_mlx_dir(path: str, cache_dir: Path = None) -> Path:
    """The mlx-lm directory for a GGUF file, converting it on first use (and again when the
    kept conversion is damaged or stale). `cache_dir`: another folder than the store's gguf/."""
    real = os.path.realpath(path)
    key = cache_key(real)
    identity = source_identity(real)
    entry = store.GGUF.open_folder(key, identity, base=cache_dir)
    if entry is not None:
        return entry
    folder = store.GGUF.folder(base=cache_dir)
    with store.GGUF.locked(folder, key) if folder is not None else contextlib.nullcontext():
        entry = store.GGUF.open_folder(key, identity, base=cache_dir)
        if entry is not None:  # another process converted it while this one waited
            return entry
        started = time.monotonic()
        log.info("converting GGUF %s (first load only)", path)
        entry = store.GGUF.make_folder(key, identity, lambda tmp: convert(real, tmp), base=cache_dir)
    log.info("GGUF converted into %s in %.1fs", entry, time.monotonic() - started)
    return entry

