"""Everything the backend keeps on disk: one root, one set of rules, every failure a miss.

Four kinds of things are kept, each in a folder of its own under the root
(MLX_BACKEND_CACHE_DIR, else $XDG_CACHE_HOME/localai-mlx, else ~/.cache/localai-mlx):
GGUF conversions (`gguf/`), the prefix cache's entries (`prompt-cache/`, or
MLX_BACKEND_PROMPT_CACHE_DIR), the lanes the check at load chose (`lanes/`) and `make
package`'s interpreter layers (`package-layers/`). The rules, for all of them:

- Private: every folder is this user's with mode 0700 (made so, or tightened; one of another
  user is never used) and every file is 0600 before any other process can see it (an
  executable of a layer 0700; its own mode is restored when the layer is copied out). What
  is kept holds users' prompts and the weights of their models.
- Atomic: a file or a folder is written under a temporary name in its kind's folder, synced,
  and renamed into place, then the folder is synced: a crash or a full disk leaves either the
  old entry or the new one, never part of one; the temporary leftovers of dead processes are
  swept.
- Verified: what is read back carries the checksum of what was written (XXH3-128; for a
  folder, a manifest of every file's size and checksum), checked before any of it is used.
  What guards against is damage, not an attacker: whoever can write in a 0700 folder runs as
  this user anyway.
- Bounded: each kind keeps at most its bytes (and entries); the least recently used go first.
- Every failure a miss: a root that is a file, a read-only mount, a full disk, a damaged or
  unreadable file, another user's folder, another process removing an entry: the load or the
  request goes on without the cache (a GGUF is then converted into a private scratch folder
  for this process). A fault is counted per kind in Status and logged once per kind and cause;
  a damaged entry is removed, logged with its path and counted.

Any thread.
"""

import atexit
import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import shutil
import stat
import struct
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import xxhash

log = logging.getLogger("mlx-backend.store")

DIR_MODE = 0o700
FILE_MODE = 0o600
ALGORITHM = "xxh3_128"
MANIFEST = ".store-manifest.json"  # written last into a kept folder: its files' sizes and checksums
TMP = ".tmp-"  # what a temporary name starts with: `.tmp-<host>-<pid>-<random>-<name>`
STALE_S = 24 * 3600.0  # a temporary leftover of another host (whose process cannot be asked) is gone after this
_CHUNK = 8 << 20  # file reads: large enough that the hash runs without the GIL, small enough to stay in cache


class NotPrivate(OSError):
    """A folder this process must not use: another user owns it."""


class Damaged(ValueError):
    """Bytes read back that are not the ones written."""


# ---- the root, and one kind's folder ------------------------------------------------


def root() -> Path:
    return Path(os.environ.get("MLX_BACKEND_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "localai-mlx"))


def private_dir(path) -> Path:
    """`path` as a folder of this user's with mode 0700, made with any missing parent.

    Raises NotPrivate for a folder of another user, NotADirectoryError when a file sits at
    `path`, and whatever mkdir or chmod raise (a read-only disk, a full one). An existing
    folder of this user's with looser modes is tightened (what it holds is verified when read).
    """
    path = Path(path)
    missing = []
    probe = path
    while not os.path.lexists(probe) and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, DIR_MODE)  # the umask may take bits off: set below
        except FileExistsError:
            continue  # another process made it meanwhile: checked like any existing one
        os.chmod(folder, DIR_MODE)
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "a file, not a folder", str(path))
    if st.st_uid != os.geteuid():
        raise NotPrivate(errno.EPERM, f"belongs to uid {st.st_uid}, not to this process's uid {os.geteuid()}",
                         str(path))
    if stat.S_IMODE(st.st_mode) != DIR_MODE:
        os.chmod(path, DIR_MODE)
    return path


# ---- checksums ----------------------------------------------------------------------


def digest(parts: Iterable) -> str:
    """The checksum of a sequence of byte strings or buffers, each framed by its length (so that
    moving bytes from one part to the next changes the result). XXH3-128: measured here 2.8-5.8
    GB/s on one core against 0.44-0.75 for SHA-256, releasing the GIL on large buffers."""
    h = xxhash.xxh3_128()
    for part in parts:
        view = memoryview(part)
        h.update(struct.pack("<Q", view.nbytes))
        h.update(view)
    return h.hexdigest()


def file_digest(path) -> str:
    """The checksum of a whole file's bytes, read in chunks."""
    h = xxhash.xxh3_128()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
    return h.hexdigest()


# ---- faults and damage, for Status ------------------------------------------------


_lock = threading.Lock()
_faults: Dict[str, int] = {}
_damaged: Dict[str, int] = {}
_warned: set = set()


def _fsync(path) -> None:
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove(path) -> None:
    """A file or a folder gone; what cannot be removed (another process's, a read-only disk) stays."""
    path = Path(path)
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        pass


def _tmp_name(name: str) -> str:
    host = os.uname().nodename.replace("-", "_") or "host"
    return f"{TMP}{host}-{os.getpid()}-{secrets.token_hex(4)}-{name}"


def _leftover(name: str, age_s: float) -> bool:
    """Is this temporary name a dead process's? Another host's: only once it is old."""
    parts = name[len(TMP):].split("-", 3)
    if len(parts) != 4 or parts[0] != (os.uname().nodename.replace("-", "_") or "host") or not parts[1].isdigit():
        return age_s > STALE_S
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # someone else's live process
    return False


class Kind:
    """One kind of thing kept: its folder, its bound, its figures."""

    def __init__(self, name: str, label: str, corrupt_key: str, env: Optional[str] = None,
                 budget: Optional[int] = None, max_entries: Optional[int] = None, depth: int = 1):
        self.name, self.label, self.corrupt_key, self.env = name, label, corrupt_key, env
        self.budget, self.max_entries, self.depth = budget, max_entries, depth
        _faults[name] = 0
        _damaged[corrupt_key] = 0

    def base(self) -> Path:
        own = os.environ.get(self.env) if self.env else None
        return Path(own) if own else root() / self.name

    # -- faults

    def miss(self, what: str, error: BaseException) -> None:
        """A fault this kind's users go on without: counted, logged once per cause."""
        cause = f"{type(error).__name__}: {getattr(error, 'strerror', None) or error}"
        where = getattr(error, "filename", None)
        with _lock:
            _faults[self.name] += 1
            first = (self.name, what, type(error).__name__, getattr(error, "errno", None)) not in _warned
            _warned.add((self.name, what, type(error).__name__, getattr(error, "errno", None)))
        if first:
            hint = (f" (it must be this user's alone: chown or remove it, or set {self.env or 'MLX_BACKEND_CACHE_DIR'})"
                    if isinstance(error, NotPrivate) else "")
            log.warning("%s: %s failed (%s%s)%s; going on without it (counted in Status as store_%s_faults)",
                        self.label, what, cause, f": {where}" if where else "", hint, self.name.replace("-", "_"))

    def damaged(self, path, reason: str, then: str) -> None:
        """One damaged entry: counted, and logged with its path, why and what happens instead."""
        with _lock:
            _damaged[self.corrupt_key] += 1
        log.warning("%s: %s is damaged (%s): %s", self.label, path, reason, then)

    # -- folders

    def folder(self, *parts: str, base: Optional[Path] = None) -> Optional[Path]:
        """This kind's folder (or a folder inside it), private; None, the fault counted, when it
        cannot be made or used."""
        path = Path(base) if base is not None else self.base()
        path = path.joinpath(*parts)
        try:
            return private_dir(path)
        except OSError as e:
            self.miss(f"using the folder {path}", e)
            return None

    @contextlib.contextmanager
    def locked(self, folder: Path, name: str) -> Iterator[None]:
        """One process at a time for `name` (a conversion, a layer). A lock that cannot be had
        (a read-only folder) is not waited for: what is made then goes to scratch anyway."""
        try:
            fd = os.open(folder / f".lock-{name}", os.O_RDWR | os.O_CREAT, FILE_MODE)
        except OSError as e:
            self.miss("taking a lock", e)
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # the lock file stays: removing it would let a third process lock a fresh inode

    # -- single files

    def write_file(self, folder: Path, name: str, fill: Callable[[Path], None]) -> int:
        """Write `folder/name` atomically: `fill` writes a temporary path in the folder, which is
        made 0600, synced and renamed into place; then the folder is synced. Its size in bytes.
        Raises what the disk raised (the caller counts it: `miss`)."""
        tmp = folder / _tmp_name(name)
        try:
            fill(tmp)
            os.chmod(tmp, FILE_MODE)
            _fsync(tmp)
            size = tmp.stat().st_size
            os.replace(tmp, folder / name)
        except BaseException:
            remove(tmp)
            raise
        with contextlib.suppress(OSError):  # the rename itself survives a crash once the folder is synced
            _fsync(folder)
        return size

    def save(self, name: str, data: bytes, *parts: str) -> bool:
        """A small entry kept with its checksum (`load` reads it back); False when it could not be."""
        folder = self.folder(*parts)
        if folder is None:
            return False
        framed = f"{ALGORITHM}:{digest([data])}\n".encode() + data
        try:
            self.write_file(folder, name, lambda tmp: Path(tmp).write_bytes(framed))
        except OSError as e:
            self.miss(f"writing {name}", e)
            return False
        self.keep_within(folder)
        return True

    def load(self, name: str, *parts: str) -> Optional[bytes]:
        """What `save` kept, verified; None when missing, unreadable or damaged (then removed)."""
        folder = self.folder(*parts)  # never another user's: what it holds would steer this process
        if folder is None:
            return None
        path = folder / name
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            self.miss(f"reading {path}", e)
            return None
        head, _, data = raw.partition(b"\n")
        if head != f"{ALGORITHM}:{digest([data])}".encode():
            self.damaged(path, "checksum mismatch", "removed; computed again")
            remove(path)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # used: the bound removes the least recently used
        return data

    # -- kept folders

    def open_folder(self, name: str, meta, base: Optional[Path] = None) -> Optional[Path]:
        """The kept folder `name` when it was finished for `meta` and every file is what was
        written; None when it is missing or was made for another `meta` (stale), and when it is
        damaged (then removed, logged and counted)."""
        entry = (Path(base) if base is not None else self.base()) / name
        state, why = folder_state(entry, meta)
        if state == "ok":
            with contextlib.suppress(OSError):
                os.utime(entry)
            return entry
        if state == "damaged":
            self.damaged(entry, why, "removed; made again")
            remove(entry)
        elif state == "stale" and entry.exists():
            log.info("%s: %s is %s; made again", self.label, entry, why)
        return None

    def make_folder(self, name: str, meta, fill: Callable[[Path], None], base: Optional[Path] = None,
                    scratch: bool = True) -> Optional[Path]:
        """Make the kept folder `name` with `fill(folder)` and seal it for `meta` (open_folder
        finds it from then on). When the store cannot keep it (no folder, a full or read-only
        disk), it is made in a private scratch folder of this process's instead and that is
        returned (with `scratch` False: None), and the caller goes on. Whatever fails in the
        store's folder is tried once more in scratch: what `fill` raises there is raised."""
        folder = self.folder(base=base)
        if folder is not None:
            tmp = folder / _tmp_name(name)
            try:
                tmp.mkdir(mode=DIR_MODE)
                os.chmod(tmp, DIR_MODE)
                fill(tmp)
                seal(tmp, meta)
                target = folder / name
                if os.path.lexists(target):  # a folder cannot be renamed over a non-empty one
                    old = folder / _tmp_name(f"old-{name}")
                    os.rename(target, old)
                    remove(old)
                os.rename(tmp, target)
                _fsync(folder)
                self.keep_within(folder, keep=target)
                return target
            except Exception as e:  # the disk's OSError, or a writer's own (MLX's RuntimeError on a full disk)
                self.miss(f"keeping {name}", e)  # a failure of `fill` itself fails again below, and is raised
            finally:
                remove(tmp)
        if not scratch:
            return None
        made = _scratch(self.name) / name
        made.mkdir(mode=DIR_MODE)
        fill(made)
        return made

    # -- the bound

    def keep_within(self, folder: Optional[Path] = None, keep: Optional[Path] = None,
                    budget: Optional[int] = None) -> Tuple[int, int]:
        """Remove the least recently used entries under `folder` (the kind's folder) until it is
        within its bytes and entries (`keep`, the entry just made, stays), and the temporary
        leftovers of dead processes. (bytes, entries) kept. Faults are misses."""
        top = Path(folder) if folder is not None else self.base()
        budget = self.budget if budget is None else budget
        try:
            found, now = [], time.time()
            for path, st in _walk(top, self.depth):
                if path.name.startswith(TMP):
                    if _leftover(path.name, now - st.st_mtime):
                        remove(path)
                    continue
                if path.name.startswith("."):
                    continue
                size = _size(path) if stat.S_ISDIR(st.st_mode) else st.st_size
                found.append((st.st_mtime, size, path))
            found.sort(key=lambda e: (e[0], str(e[2])))
            total = sum(size for _, size, _ in found)
            while found and ((budget is not None and total > budget)
                             or (self.max_entries is not None and len(found) > self.max_entries)):
                mtime, size, path = found[0]
                if keep is not None and path == keep:
                    if len(found) == 1:
                        break
                    found.append(found.pop(0))  # the newest entry goes last, whatever its mtime
                    continue
                found.pop(0)
                remove(path)
                total -= size
            return total, len(found)
        except OSError as e:
            self.miss("keeping the folder within its bound", e)
            return 0, 0


def _walk(top: Path, depth: int):
    """(path, lstat) of every entry `depth` folders below `top` (temporary names at any level
    above it too, so the leftovers of dead processes are found)."""
    level = [top]
    for d in range(depth):
        nxt = []
        for folder in level:
            try:
                entries = list(os.scandir(folder))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for e in entries:
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # another process removed it
                if d == depth - 1 or e.name.startswith(TMP):
                    yield Path(e.path), st
                elif stat.S_ISDIR(st.st_mode):
                    nxt.append(Path(e.path))
        level = nxt


def _size(folder: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(folder):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


# ---- sealed folders: a manifest of every entry, written last ------------------------


def _entries(folder: Path) -> List[list]:
    """[path, mode, size, checksum or link text] of every file, link and folder under `folder`."""
    out = []
    for dirpath, dirs, files in os.walk(folder):
        for name in sorted(dirs + files):
            path = Path(dirpath) / name
            rel = path.relative_to(folder).as_posix()
            if rel == MANIFEST:
                continue
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                out.append([rel, stat.S_IMODE(st.st_mode), 0, "link:" + os.readlink(path)])
            elif stat.S_ISREG(st.st_mode):
                out.append([rel, stat.S_IMODE(st.st_mode), st.st_size, file_digest(path)])
            else:
                out.append([rel, stat.S_IMODE(st.st_mode), 0, None])
    return sorted(out)


def _private_mode(mode: int) -> int:
    return DIR_MODE if mode & stat.S_IXUSR else FILE_MODE


def seal(folder: Path, meta) -> None:
    """Every file of `folder` private and synced, then the manifest naming each with its mode,
    size and checksum (so a manifest means the data is there, as written)."""
    entries = _entries(folder)
    for rel, mode, size, content in entries:
        path = folder / rel
        if content is None:
            os.chmod(path, DIR_MODE)
        elif not content.startswith("link:"):
            os.chmod(path, _private_mode(mode))
            _fsync(path)
    manifest = folder / MANIFEST
    manifest.write_text(json.dumps({"meta": meta, "algorithm": ALGORITHM, "entries": entries,
                                    "mode": stat.S_IMODE(folder.stat().st_mode)}))
    os.chmod(manifest, FILE_MODE)
    os.chmod(folder, DIR_MODE)
    _fsync(manifest)
    _fsync(folder)


def folder_state(folder: Path, meta) -> Tuple[str, str]:
    """("ok", ""): sealed for this very `meta` and every entry is what was written. ("stale",
    why): none, unfinished or for another `meta`. ("damaged", why): an entry missing, cut
    short, added or failing its checksum, or the manifest unreadable."""
    try:
        record = json.loads((folder / MANIFEST).read_text())
    except (FileNotFoundError, NotADirectoryError):
        return "stale", "not made yet, or not finished"
    except (OSError, ValueError) as e:
        return "damaged", f"its manifest: {type(e).__name__}: {e}"
    try:
        if record.get("meta") != meta or record.get("algorithm") != ALGORITHM:
            return "stale", "made for another source or by another version"
        kept = {e[0]: e for e in record["entries"]}
        found = _entries(folder)
        if [e[0] for e in found] != sorted(kept):
            return "damaged", "its files are not the ones written"
        for rel, _, size, content in found:
            want = kept[rel]
            if (content is None) != (want[3] is None) or size != want[2] or content != want[3]:
                return "damaged", f"{rel} is cut short or fails its checksum"
    except (OSError, KeyError, TypeError, AttributeError, IndexError) as e:
        return "damaged", f"{type(e).__name__}: {e}"
    return "ok", ""


def copy_out(entry: Path, dest: Path) -> None:
    """A kept folder's files copied to `dest` with the modes they had when kept (not the
    store's private ones). What the copy raises (a full disk) is raised."""
    record = json.loads((entry / MANIFEST).read_text())
    shutil.copytree(entry, dest, symlinks=True, ignore=lambda d, names: [MANIFEST] if Path(d) == entry else [])
    for rel, mode, _, content in record["entries"]:
        if content is None or not content.startswith("link:"):
            os.chmod(dest / rel, mode)
    os.chmod(dest, record.get("mode", DIR_MODE))


# ---- outside the root: one file or folder put in place whole ------------------------


def publish(made: Path, target: Path) -> None:
    """Put `made` (a file or a folder written beside `target`) in place of `target` whole, and
    sync the folder: what the backend writes outside the store (a LocalAI backend folder's
    run.sh, `make package`'s tar and tree) is never seen half written."""
    made, target = Path(made), Path(target)
    if made.is_dir() and target.is_dir() and not target.is_symlink():
        old = target.with_name(_tmp_name(f"old-{target.name}"))
        os.rename(target, old)  # a folder cannot be renamed over a non-empty one
        os.rename(made, target)
        remove(old)
    else:
        if made.is_file():
            _fsync(made)
        os.replace(made, target)
    with contextlib.suppress(OSError):
        _fsync(target.parent)


# ---- scratch: where what cannot be kept is made for this process alone -------------


_scratch_root: Optional[Path] = None


def _scratch(kind: str) -> Path:
    global _scratch_root
    with _lock:
        if _scratch_root is None:
            _scratch_root = Path(tempfile.mkdtemp(prefix="mlx-backend-scratch-"))  # 0700
            atexit.register(shutil.rmtree, str(_scratch_root), True)
        folder = _scratch_root / f"{kind}-{secrets.token_hex(4)}"
        folder.mkdir(mode=DIR_MODE)
        return folder


# ---- the kinds, and Status --------------------------------------------------------


GGUF = Kind("gguf", "GGUF cache", "gguf_cache_corrupt", budget=64 << 30)
PROMPTS = Kind("prompt-cache", "prompt cache", "prompt_cache_disk_corrupt", env="MLX_BACKEND_PROMPT_CACHE_DIR",
               depth=2)  # <model fingerprint>/<entry>; its bytes bound is a load option (prompt_cache_disk_bytes)
LANES = Kind("lanes", "lane verdicts", "lane_cache_corrupt", budget=4 << 20, max_entries=4096)
LAYERS = Kind("package-layers", "package layers", "package_layer_corrupt", max_entries=1)  # ~1 GB each: the newest
KINDS = (GGUF, PROMPTS, LANES, LAYERS)


def figures() -> Dict[str, int]:
    """For Status: per kind, the faults gone on without and the damaged entries found since start."""
    with _lock:
        out = {f"store_{k.replace('-', '_')}_faults": n for k, n in _faults.items()}
        out.update(_damaged)
    return out
