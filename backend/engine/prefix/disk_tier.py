"""The prefix cache's disk tier: one model's folder of entries, and the writer that fills it.

On disk: `<prompt-cache folder>/<model fingerprint>/<token hash>.safetensors`
(engine/prefix/cache_files.py: the format). What memory evicts goes to a writer thread;
a lookup finds the longest file whose tokens a prompt extends (or, for a cache that
can be trimmed, shares a prefix with) from an index of the folder, refreshed when
its listing changes (another process sharing the folder), and reads it back on the
engine thread. A file is verified before anything of it is served (its metadata when the
index reads it, its arrays when they are loaded): one that is damaged or cannot be read is
removed, logged once with its path and counted (store.py); one of another format or model
is removed. A byte budget over the whole prompt-cache folder removes the least recently used
files (mtime, refreshed on every hit: store.Kind.keep_within). The folders are the store's,
this user's alone: one that cannot be used turns the tier off, and a write that fails (a full
or read-only disk) keeps the entry in memory only; either is a fault counted in Status.

Engine thread: DiskTier.lookup/read. Writer thread: the writes and the budget.
"""

import logging
import os
import queue
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import can_trim_prompt_cache

import store
from engine.prefix.cache_files import (FORMAT, SUFFIX, decode_cache, encode_cache, file_name, tokens_of, tokens_text,
                                       write_atomically)
from engine.prefix.file_checks import Damaged, Foreign, check_arrays, check_header, read_header, seal

log = logging.getLogger("mlx-backend.prompt-store")

DEFAULT_DISK_BYTES = 4 << 30
MAX_QUEUED_BYTES = 1 << 30  # evicted entries waiting for the writer, at most
# The largest entry kept on disk: a read of it on the engine thread stays within about
# one CPU prefill chunk (~1.5 s) at the read rates measured here (DiskTier.read).
MAX_ENTRY_BYTES = 1 << 30


def default_disk_bytes(root: Path) -> int:
    """4 GiB, or a quarter of the free space of the disk holding `root` when that is less."""
    probe = root
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return 0
    return min(DEFAULT_DISK_BYTES, free // 4)


# ---- the writer thread -------------------------------------------------------


class Writer:
    """Writes entries to disk off the engine thread, and keeps the folder within its budget.

    Off the engine thread because a write is a copy of the entry plus two fsyncs:
    measured here (2-core CPU shared with other work, virtio disk), 20.7 MB (450
    tokens of SmolLM2 in float32) in 20-63 ms and 92 MB in 79-216 ms, the first
    write into a new folder up to 1.3 s; on the engine thread that would stall
    every stream on every eviction. Meanwhile a Python loop on the calling thread
    saw gaps of 1-6 ms (one of 44 ms on the loaded machine): the copy releases
    the GIL. The arrays handed over are evaluated (DiskTier.save) and owned by
    no one else (entries evicted from memory), and saving an evaluated array only
    reads its buffer: no MLX computation runs on this thread, which has no
    stream of its own. (Figures: a script timing DiskTier.save + drain_all and
    DiskTier.read on synthetic 30-layer caches.)
    """

    def __init__(self, root: Path, budget: int):
        self.root, self.budget = root, budget
        self._jobs: "queue.Queue" = queue.Queue()
        self._idle = threading.Condition()
        self._pending = 0
        self.queued_bytes = 0
        self.disk_bytes = 0  # the whole folder, as of the last budget pass
        self.disk_files = 0
        self.writes = 0
        self._thread = threading.Thread(target=self._run, name="prompt-cache-writer", daemon=True)
        self._thread.start()
        self.put(("budget",))

    def put(self, job: tuple, nbytes: int = 0) -> bool:
        """Queue a job; False (not queued) when the writes already queued hold MAX_QUEUED_BYTES:
        evicted entries wait here in memory, beyond the memory tier's own bound."""
        with self._idle:
            if nbytes and self.queued_bytes + nbytes > MAX_QUEUED_BYTES:
                return False
            self._pending += 1
            self.queued_bytes += nbytes
        self._jobs.put((job, nbytes))
        return True

    def drain(self, timeout: float) -> bool:
        """Wait until every queued write is done (True), or `timeout` seconds (False)."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def _run(self) -> None:
        while True:
            job, nbytes = self._jobs.get()
            try:
                if job[0] == "write":
                    self._write(*job[1:])
                self._keep_budget()
            except Exception:
                log.exception("prompt cache: keeping the folder within its budget failed")
            finally:
                with self._idle:
                    self._pending -= 1
                    self.queued_bytes -= nbytes
                    self._idle.notify_all()

    def _write(self, tier: "DiskTier", name: str, arrays, metadata) -> None:
        try:
            metadata = seal(metadata, arrays)  # hashed here, off the engine thread
            size = write_atomically(tier.folder, name, arrays, metadata)
        except Exception as e:  # a full or read-only disk: this entry stays in memory only
            store.PROMPTS.miss(f"writing an entry into {tier.folder}", e)
            return
        tier.written(name, metadata, size)
        self.writes += 1

    def _keep_budget(self) -> None:
        """Remove least recently used files until the folder is within the budget."""
        self.disk_bytes, self.disk_files = store.PROMPTS.keep_within(self.root, budget=self.budget)


_writers: Dict[Tuple[str, int], Writer] = {}
_writers_lock = threading.Lock()


def writer_for(root: Path, budget: int) -> Writer:
    """One writer thread per folder and budget for the life of the process."""
    with _writers_lock:
        key = (str(root), budget)
        if key not in _writers:
            _writers[key] = Writer(root, budget)
        return _writers[key]


def drain_all(timeout: float) -> bool:
    """Finish the queued writes of every writer (the shutdown), within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    with _writers_lock:
        writers = list(_writers.values())
    return all(w.drain(max(deadline - time.monotonic(), 0.0)) for w in writers)


# ---- one model's files ---------------------------------------------------------


class _Known:
    __slots__ = ("tokens", "trimmable", "cache_type")

    def __init__(self, tokens: np.ndarray, trimmable: bool, cache_type: str):
        self.tokens, self.trimmable, self.cache_type = tokens, trimmable, cache_type


class DiskTier:
    """One model's folder: an index of its files' tokens, lookups and reads (engine thread);
    writes go through the folder's Writer."""

    def __init__(self, root: Path, model_fingerprint: str, budget: int):
        """OSError (store.NotPrivate among them) when the folder cannot be this user's alone."""
        self.root, self.fingerprint, self.budget = root, model_fingerprint, budget
        self.folder = store.private_dir(root / model_fingerprint)
        self.writer = writer_for(root, budget)
        self._lock = threading.Lock()  # the index: the writer adds what it wrote
        self._index: Dict[str, _Known] = {}
        self._listed = None  # the folder's mtime when last listed
        self._refused: Dict[str, Tuple[int, int]] = {}  # name -> (mtime, size) of a file that could not be removed
        self.rescan()

    # -- the index

    def rescan(self, force: bool = False) -> None:
        """Bring the index up to the folder's listing, when it changed (or `force`).

        A stat when nothing changed; else a listing and one header read per new
        file. Files written by other processes appear here on the next lookup.
        """
        try:
            mtime = self.folder.stat().st_mtime_ns
        except FileNotFoundError:
            with self._lock:
                self._index.clear()
            self._listed = None
            return
        if mtime == self._listed and not force:
            return
        self._listed = mtime
        try:
            names = {n for n in os.listdir(self.folder) if n.endswith(SUFFIX) and not n.startswith(".")}
        except FileNotFoundError:
            names = set()
        with self._lock:
            for gone in set(self._index) - names:
                del self._index[gone]
            new = names - set(self._index)
        for name in new:
            known = self._read_known(name)
            if known is not None:
                with self._lock:
                    self._index[name] = known

    def _read_known(self, name: str) -> Optional[_Known]:
        path = self.folder / name
        if self._still_refused(path):
            return None
        try:
            meta = read_header(path)
            check_header(meta, self.fingerprint)
            return _Known(tokens_of(meta["tokens"]), meta.get("trimmable") == "1",
                          meta.get("cache_type", "assistant"))
        except FileNotFoundError:
            return None
        except Exception as e:  # damaged or foreign: never served, removed
            self._drop(path, e)
            return None

    def _drop(self, path: Path, error: Exception) -> None:
        """A file that is not served: removed; logged once (counted when damaged)."""
        then = "removed; its prompts are computed again"
        if isinstance(error, Foreign):
            log.warning("prompt cache: %s is not this model's (%s): removed", path, error)
        elif isinstance(error, Damaged):
            store.PROMPTS.damaged(path, str(error), then)
        else:  # what the reader or the decoder raised: damage its checksum did not name
            store.PROMPTS.damaged(path, f"{type(error).__name__}: {error}", then)
        try:
            st = path.stat()
        except OSError:
            st = None
        store.remove(path)
        if st is not None and path.exists():  # a read-only folder: not read (nor logged) again
            self._refused[path.name] = (st.st_mtime_ns, st.st_size)

    def _still_refused(self, path: Path) -> bool:
        known = self._refused.get(path.name)
        if known is None:
            return False
        try:
            st = path.stat()
        except OSError:
            return False
        return known == (st.st_mtime_ns, st.st_size)  # a file written there since is read anew

    def written(self, name: str, metadata: Dict[str, str], size: int) -> None:
        """The writer's report of a file now in place (writer thread)."""
        with self._lock:
            self._index[name] = _Known(tokens_of(metadata["tokens"]), metadata["trimmable"] == "1",
                                       metadata["cache_type"])

    @property
    def entries(self) -> int:
        return len(self._index)

    # -- lookups and reads (engine thread)

    def best(self, tokens: List[int], better_than: int) -> Optional[Tuple[str, int]]:
        """(file name, prompt tokens it serves) of the entry serving more than `better_than`
        tokens of `tokens`, the most of any; None when none does."""
        self.rescan()
        if not tokens:
            return None
        prompt = np.asarray(tokens, dtype=np.int64)
        with self._lock:
            known = list(self._index.items())
        best = None
        for name, k in known:
            n = min(len(k.tokens), len(prompt))
            if n <= better_than:
                continue
            same = k.tokens[:n] == prompt[:n]
            common = n if same.all() else int(np.argmin(same))
            if common == len(k.tokens) and common < len(prompt):
                served = common  # the whole entry is a prefix of the prompt
            elif k.trimmable and common > 0:
                served = min(common, len(prompt) - 1)  # cut back to the shared prefix
            else:
                continue
            if served > better_than and (best is None or served > best[1]):
                best = (name, served)
        return best

    def read(self, name: str) -> Optional[Tuple[List[int], List[Any], str]]:
        """(tokens, cache, cache_type) of one file, evaluated; None (and the file removed) when
        it cannot be read. Its mtime is refreshed: the budget removes least recently used.

        On the engine thread, so running streams wait for it: measured here 6-20 ms for
        20.7 MB and 15-70 ms for 92 MB (2000 tokens of SmolLM2 in float32) from the page
        cache, against ~1.5 s for one 128-token prefill chunk on this CPU; an entry stays
        under one chunk's stall up to about 1 GB (~22k tokens of that model). A lookup in
        the index is 0.1-0.2 ms. What a larger entry would need (a read spread over steps)
        is left for later.
        """
        path = self.folder / name
        try:
            meta = read_header(path)
            check_header(meta, self.fingerprint)
            arrays = mx.load(str(path))
            mx.eval(list(arrays.values()))
            check_arrays(meta, arrays)  # before any of it becomes a cache
            cache = decode_cache(arrays, meta["layers"])
            mx.eval([layer.state for layer in cache])
        except FileNotFoundError:  # another process's budget removed it meanwhile
            self._forget(name)
            return None
        except Exception as e:
            self._drop(path, e)
            self._forget(name)
            return None
        try:
            os.utime(path)
        except OSError:
            pass
        return [int(t) for t in tokens_of(meta["tokens"])], cache, meta.get("cache_type", "assistant")

    def _forget(self, name: str) -> None:
        with self._lock:
            self._index.pop(name, None)

    # -- writes

    def save(self, tokens: List[int], cache: List[Any], cache_type: str) -> bool:
        """Queue one entry for writing (an existing file is only marked as used); False when
        this entry cannot be kept on disk."""
        if not tokens or not all(isinstance(t, int) for t in tokens):
            return False  # (a vision prompt's media keys are ints too: negative 62-bit hashes)
        name = file_name(tokens)
        path = self.folder / name
        if name in self._index and path.exists():
            try:
                os.utime(path)
                return True
            except OSError:
                pass
        try:
            arrays, layers = encode_cache(cache)
        except ValueError as e:
            log.debug("prompt cache: not kept on disk: %s", e)
            return False
        if sum(a.nbytes for a in arrays.values()) > min(self.budget, MAX_ENTRY_BYTES):
            return False
        # The writer thread only reads buffers (to hash them, then to write them): MLX runs
        # nothing there (a thread of its own has no stream to run on), so whatever is still
        # lazy is computed here, and made contiguous (a view's buffer is not its bytes).
        arrays = {k: mx.contiguous(a) for k, a in arrays.items()}
        mx.eval(list(arrays.values()))
        metadata = {"format": FORMAT, "fingerprint": self.fingerprint, "tokens": tokens_text(tokens),
                    "trimmable": "1" if can_trim_prompt_cache(cache) else "0", "cache_type": cache_type,
                    "layers": layers}
        return self.writer.put(("write", self, name, arrays, metadata), sum(a.nbytes for a in arrays.values()))


