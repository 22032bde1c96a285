"""GGUF files as mlx-lm model directories, converted once and kept.

A GGUF file is converted (gguf_convert) into a plain mlx-lm directory under a
cache folder; mlx-lm's own loader then loads that directory like any other, so
the detokenizer, chat template, tool parser and thinking markers are inferred
by the same code for both kinds of model. This module is the cache: when an
entry is still valid (and not damaged), how two processes share one conversion, and
that no other user can read it (folders 0700, files 0600: private_files.py).
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
from typing import Any, Dict, List, Tuple

from loaders import checksums
from loaders.gguf_convert import CONVERTER_VERSION, GGUFError, convert
from loaders.private_files import DIR_MODE, open_private, private_dir, private_file

log = logging.getLogger("mlx-backend.gguf")


def default_cache_dir() -> Path:
    root = os.environ.get("MLX_BACKEND_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "localai-mlx")
    return Path(root) / "gguf"


# ---- the conversion cache --------------------------------------------------------
#
# One entry per source path: `<key>/` holds the converted directory and, written
# last, COMPLETE (the source's identity, every file's size and its checksum). An
# entry without a matching record is torn (a crash, a full disk) or stale (the
# source changed, or an earlier version wrote it without checksums) and is rebuilt;
# one whose files are not what the record says is damaged: counted, logged, rebuilt.
# Every load verifies the whole entry before mlx-lm reads it (XXH3, hashed as it is
# read: 10-45 ms more per 100 MB here, docs/prefix-cache.md; a small part of a load).
# Conversions run in `.partial-<key>-<host>-<pid>-<random>` folders, are fsynced,
# then renamed into place under a per-key file lock, so two processes never convert
# the same file at once: the waiter reuses the result.

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


SUMS = checksums.ALGORITHM  # the record's key for the files' checksums (sizes stay under "files", as before)


def entry_state(entry: Path, identity: Dict[str, Any]) -> Tuple[str, str]:
    """("ok", ""): the entry was finished for this very source and every file is what was
    written. ("stale", why): none, or for another source or version: converted (again).
    ("damaged", why): a file is missing, cut short or fails its checksum."""
    try:
        record = json.loads((entry / COMPLETE).read_text())
    except FileNotFoundError:
        return "stale", "no finished conversion"
    except (OSError, ValueError) as e:
        return "damaged", f"{COMPLETE}: {type(e).__name__}: {e}"
    try:
        if record.get("source") != identity:
            return "stale", "converted from another file or by another version"
        files, sums = record["files"], record.get(SUMS)
        if not isinstance(sums, dict) or set(sums) != set(files):
            return "stale", "written without checksums"
        for name, size in sorted(files.items()):
            path = entry / name
            if not path.is_file() or path.stat().st_size != size:
                return "damaged", f"{name} is missing or cut short"
            if checksums.file_digest(path) != sums[name]:
                return "damaged", f"{name} fails its checksum"
    except (OSError, KeyError, AttributeError, TypeError) as e:
        return "damaged", f"{type(e).__name__}: {e}"
    return "ok", ""


def _fsync(path: Path) -> None:
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _seal(tmp: Path, identity: Dict[str, Any]) -> None:
    """Every file private and on disk, then the record naming them with their sizes and
    checksums (so a record means the data is there, as written)."""
    files, sums = {}, {}
    for f in sorted(tmp.rglob("*")):
        if f.is_dir():
            os.chmod(f, DIR_MODE)
            continue
        private_file(f)
        _fsync(f)
        name = f.relative_to(tmp).as_posix()
        files[name], sums[name] = f.stat().st_size, checksums.file_digest(f)
    record = tmp / COMPLETE
    record.write_text(json.dumps({"source": identity, "files": files, SUMS: sums}))
    private_file(record)
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
    fd = open_private(lock_path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _private_cache(cache_dir: Path) -> Path:
    """The cache folder, this user's alone (an older one is tightened); GGUFError, with what to
    do, when it cannot be."""
    try:
        return private_dir(cache_dir)
    except OSError as e:
        raise GGUFError(f"the GGUF cache folder {cache_dir} cannot be used ({e.strerror or e}): it holds "
                        "converted models and must be this user's alone; chown or remove it, or set "
                        "MLX_BACKEND_CACHE_DIR") from None


def gguf_to_mlx_dir(path: str, cache_dir: Path = None) -> Path:
    """The mlx-lm directory for a GGUF file, converting it on first use (and again when the
    conversion on disk is damaged)."""
    cache_dir = _private_cache(Path(cache_dir or default_cache_dir()))
    real = os.path.realpath(path)
    key = _cache_key(real)
    target = cache_dir / key
    identity = source_identity(real)
    if entry_state(target, identity)[0] == "ok":
        return target
    with _locked(cache_dir / f".lock-{key}"):
        state, why = entry_state(target, identity)
        if state == "ok":  # another process converted it while this one waited
            return target
        clean_stale(cache_dir)
        if state == "damaged":
            checksums.note_damaged(checksums.GGUF_CACHE, target, why, f"converting {path} again")
        elif target.exists():
            log.warning("GGUF cache entry %s: %s (%s); converting it again", target, why, path)
        started = time.monotonic()
        log.info("converting GGUF %s into %s (first load only)", path, target)
        tmp = cache_dir / f"{PARTIAL_PREFIX}{key}-{_host()}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            tmp.mkdir(mode=DIR_MODE)
            os.chmod(tmp, DIR_MODE)  # whatever the umask
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
