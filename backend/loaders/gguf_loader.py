"""GGUF files as mlx-lm model directories, converted once and kept.

A GGUF file is converted (gguf_convert) into a plain mlx-lm directory under a
cache folder; mlx-lm's own loader then loads that directory like any other, so
the detokenizer, chat template, tool parser and thinking markers are inferred
by the same code for both kinds of model. This module is the cache: when an
entry is still valid, and how two processes share one conversion.
"""

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any, Dict, List

from loaders.gguf_convert import CONVERTER_VERSION, convert

log = logging.getLogger("mlx-backend.gguf")


def default_cache_dir() -> Path:
    root = os.environ.get("MLX_BACKEND_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "localai-mlx")
    return Path(root) / "gguf"


# ---- the conversion cache --------------------------------------------------------
#
# One entry per source path: `<key>/` holds the converted directory and, written
# last, COMPLETE (the source's identity and every file's size). An entry without
# a matching record is torn (a crash, a full disk) or stale (the source changed)
# and is rebuilt. Conversions run in `.partial-<key>-<host>-<pid>-<random>`
# folders, are fsynced, then renamed into place under a per-key file lock, so two
# processes never convert the same file at once: the waiter reuses the result.

COMPLETE = "COMPLETE"
PARTIAL_PREFIX = ".partial-"
STALE_PREFIX = ".stale-"
PARTIAL_MAX_AGE_S = 24 * 3600.0  # a partial folder whose owner cannot be checked (another host) is stale after this
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


def _cache_key(real_path: str) -> str:
    return hashlib.sha256(f"{real_path}|{CONVERTER_VERSION}".encode()).hexdigest()[:24]


def entry_is_complete(entry: Path, identity: Dict[str, Any]) -> bool:
    """The entry was finished for this very source, and no file of it is missing or cut short."""
    try:
        record = json.loads((entry / COMPLETE).read_text())
        if record.get("source") != identity:
            return False
        return all((entry / name).stat().st_size == size for name, size in record["files"].items())
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        return False


def _fsync(path: Path) -> None:
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _seal(tmp: Path, identity: Dict[str, Any]) -> None:
    """Every file on disk, then the record naming them (so a record means the data is there)."""
    files = {}
    for f in sorted(tmp.iterdir()):
        if f.is_file():
            _fsync(f)
            files[f.name] = f.stat().st_size
    record = tmp / COMPLETE
    record.write_text(json.dumps({"source": identity, "files": files}))
    _fsync(record)
    _fsync(tmp)


def _owner_alive(name: str) -> bool:
    """Is the process that named this partial folder still running? Unknown owners count as alive."""
    parts = name[len(PARTIAL_PREFIX):].split("-")
    if len(parts) != 4 or parts[1] != _host() or not parts[2].isdigit():
        return True
    try:
        os.kill(int(parts[2]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def _host() -> str:
    return os.uname().nodename.replace("-", "_") or "host"


def clean_stale(cache_dir: Path, now: float = None) -> List[str]:
    """Remove partial folders of dead conversions and leftovers of replaced entries; names removed."""
    now = time.time() if now is None else now
    removed = []
    for child in cache_dir.iterdir():
        name = child.name
        if not child.is_dir() or not name.startswith((PARTIAL_PREFIX, STALE_PREFIX)):
            continue
        try:
            old = now - child.stat().st_mtime > PARTIAL_MAX_AGE_S
        except OSError:
            continue
        if name.startswith(STALE_PREFIX) or old or not _owner_alive(name):
            shutil.rmtree(child, ignore_errors=True)
            removed.append(name)
    if removed:
        log.info("removed %d stale conversion folder(s) from %s", len(removed), cache_dir)
    return removed


@contextlib.contextmanager
def _locked(lock_path: Path):
    # The lock file stays: removing it would let a third process lock a fresh inode.
    with open(lock_path, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def gguf_to_mlx_dir(path: str, cache_dir: Path = None) -> Path:
    """The mlx-lm directory for a GGUF file, converting it on first use."""
    cache_dir = Path(cache_dir or default_cache_dir())
    real = os.path.realpath(path)
    key = _cache_key(real)
    target = cache_dir / key
    identity = source_identity(real)
    if entry_is_complete(target, identity):
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _locked(cache_dir / f".lock-{key}"):
        if entry_is_complete(target, identity):  # another process converted it while this one waited
            return target
        clean_stale(cache_dir)
        if target.exists():
            log.warning("GGUF cache entry %s is incomplete or from another version of %s; rebuilding", target, path)
        started = time.monotonic()
        log.info("converting GGUF %s into %s (first load only)", path, target)
        tmp = cache_dir / f"{PARTIAL_PREFIX}{key}-{_host()}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            tmp.mkdir()
            convert(real, tmp)
            _seal(tmp, identity)
            if target.exists():
                # A directory cannot be renamed over a non-empty one: move the old aside first.
                old = cache_dir / f"{STALE_PREFIX}{key}-{secrets.token_hex(4)}"
                target.rename(old)
                shutil.rmtree(old, ignore_errors=True)
            tmp.rename(target)
            _fsync(cache_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("GGUF converted in %.1fs", time.monotonic() - started)
    return target
