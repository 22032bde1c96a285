"""The prefix cache in two tiers: mlx-lm's LRUPromptCache in memory, files on disk.

`PromptStore` is mlx-lm's LRUPromptCache (same calls: fetch_nearest_cache,
insert_cache with its cache_type, nbytes, trim_to, len) with a `DiskTier`
behind it. What memory evicts, and what it still holds when the batch closes
(a model swap, the shutdown), goes to disk; a prompt that memory serves no
better than disk is served from the longest file whose tokens it extends (or,
for a cache that can be trimmed, shares a prefix with), read back into memory.

On disk: `<MLX_BACKEND_CACHE_DIR>/prompt-cache/<model fingerprint>/<token hash>.safetensors`.
The fingerprint covers the model as loaded (weights by name, size and mtime,
config, dtype, adapters and their scales, KV cache type), so another model,
adapter, dtype or KV cache type never matches. Each file holds one entry's
arrays and, in its safetensors metadata, its tokens and how to rebuild its
cache objects, mlx-lm's classes and ours (loaders/kv_cache.py) alike. Files
appear by atomic rename of a uniquely named temporary file in the same folder
(fsync first), so processes sharing the folder never see a partial file; one
that is unreadable anyway (torn by a crash of the disk, edited) is removed.
A byte budget over the whole prompt-cache folder removes the least recently
used files (mtime, refreshed on every hit).

Engine thread: PromptStore, DiskTier.lookup/read. Writer thread: the files' writes
and the budget. The figures (`figures`) are read by any thread.
"""

import base64
import hashlib
import json
import logging
import os
import queue
import shutil
import struct
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import mlx.core as mx
import numpy as np
from mlx_lm.models import cache as lm_cache
from mlx_lm.models.cache import LRUPromptCache, PromptTrie, can_trim_prompt_cache

log = logging.getLogger("mlx-backend.prompt-store")

FORMAT = "mlx-backend-prompt-cache/1"
SUFFIX = ".safetensors"
STALE_TMP_S = 3600.0  # a temporary file this old was left by a process that died mid-write
DEFAULT_DISK_BYTES = 4 << 30
MAX_QUEUED_BYTES = 1 << 30  # evicted entries waiting for the writer, at most
# The largest entry kept on disk: a read of it on the engine thread stays within about
# one CPU prefill chunk (~1.5 s) at the read rates measured here (DiskTier.read).
MAX_ENTRY_BYTES = 1 << 30


def folder_root() -> Path:
    """Where prompt caches live: MLX_BACKEND_PROMPT_CACHE_DIR, else next to the converted
    GGUF models (MLX_BACKEND_CACHE_DIR/prompt-cache)."""
    from loaders.gguf_loader import default_cache_dir

    own = os.environ.get("MLX_BACKEND_PROMPT_CACHE_DIR")
    return Path(own) if own else default_cache_dir().parent / "prompt-cache"


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


# ---- the model's fingerprint ------------------------------------------------


def _files_of(source: str) -> List[Tuple[str, int, int]]:
    """(name, size, mtime_ns) of the weights and config files: what changes when the model does."""
    path = Path(source)
    try:
        if path.is_file():
            st = path.stat()
            return [(path.name, st.st_size, st.st_mtime_ns)]
        if path.is_dir():
            out = []
            for entry in sorted(os.scandir(path), key=lambda e: e.name):
                if entry.is_file() and entry.name.endswith((".safetensors", ".json", ".gguf", ".npz")):
                    st = entry.stat()
                    out.append((entry.name, st.st_size, st.st_mtime_ns))
            return out
    except OSError:
        pass
    return []  # a hub id: the name and config below still tell models apart


def fingerprint(lm) -> str:
    """A key for everything about the loaded model that changes its KV cache.

    Cheap on purpose (a listing and a stat per file, no weight read: well under
    a millisecond for a model directory), and computed when the batch is built,
    not in LoadModel. Adapter directories are stat'ed the same way.
    """
    kv = getattr(lm, "kv", None)
    parts = {
        "format": FORMAT,
        "source": os.path.abspath(lm.source) if os.path.exists(lm.source) else lm.source,
        "files": _files_of(lm.source),
        "config": lm.config,
        "dtype": lm.dtype,
        "kind": getattr(lm, "kind", "text"),
        "adapters": [(os.path.abspath(a), _files_of(a)) for a in getattr(lm, "adapters", [])],
        "adapter_scales": list(getattr(lm, "adapter_scales", [])),
        "kv": None if kv is None else [kv.bits, kv.group_size, kv.dtype],
    }
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# ---- cache objects <-> arrays and a description ------------------------------


def _class_tag(layer) -> Optional[str]:
    """How a cache class is named in the file (None: a class this format does not know)."""
    from loaders import kv_cache

    cls = type(layer)
    if isinstance(layer, kv_cache.CastRow):
        return f"cast:{str(cls.dtype).rsplit('.', 1)[-1]}"
    if cls is kv_cache.QuantizedRow:
        return "ours:QuantizedRow"
    if getattr(lm_cache, cls.__name__, None) is cls:
        return f"mlx_lm:{cls.__name__}"
    return None


def _class_of(tag: str):
    from loaders import kv_cache

    kind, name = tag.split(":", 1)
    if kind == "cast":
        return kv_cache._row_class(getattr(mx, name))
    if kind == "ours" and name == "QuantizedRow":
        return kv_cache.QuantizedRow
    if kind == "mlx_lm" and isinstance(getattr(lm_cache, name, None), type):
        return getattr(lm_cache, name)
    raise ValueError(f"unknown cache class {tag!r}")


def _encode(value, arrays: Dict[str, mx.array]):
    """A state (nested tuples and lists of arrays and scalars) as JSON, its arrays set aside."""
    if isinstance(value, mx.array):
        key = f"a{len(arrays)}"
        arrays[key] = value
        return {"a": key}
    if value is None:
        return {"n": 0}
    if isinstance(value, bool):
        return {"b": value}
    if isinstance(value, int):
        return {"i": value}
    if isinstance(value, float):
        return {"f": value}
    if isinstance(value, str):
        return {"s": value}
    if isinstance(value, tuple):
        return {"t": [_encode(v, arrays) for v in value]}
    if isinstance(value, list):
        return {"l": [_encode(v, arrays) for v in value]}
    raise ValueError(f"a cache state holds a {type(value).__name__}")


def _decode(node, arrays: Dict[str, mx.array]):
    (kind, v), = node.items()
    if kind == "a":
        return arrays[v]
    if kind == "n":
        return None
    if kind in ("b", "i", "f", "s"):
        return v
    if kind == "t":
        return tuple(_decode(x, arrays) for x in v)
    if kind == "l":
        return [_decode(x, arrays) for x in v]
    raise ValueError(f"unknown node {kind!r}")


def _describe(layer, arrays: Dict[str, mx.array]) -> dict:
    tag = _class_tag(layer)
    if tag is None:
        raise ValueError(f"{type(layer).__name__} is not kept on disk")
    if isinstance(layer, lm_cache.CacheList):  # its own state names classes in mlx-lm's module only
        return {"c": tag, "parts": [_describe(c, arrays) for c in layer.caches]}
    return {"c": tag, "state": _encode(layer.state, arrays)}


def _rebuild(node: dict, arrays: Dict[str, mx.array]):
    cls = _class_of(node["c"])
    if cls is lm_cache.CacheList:
        return lm_cache.CacheList(*(_rebuild(p, arrays) for p in node["parts"]))
    layer = cls.__new__(cls)  # as mlx-lm's from_state: no __init__, the state is everything
    layer.state = _decode(node["state"], arrays)
    return layer


def encode_cache(cache: List[Any]) -> Tuple[Dict[str, mx.array], str]:
    """A per-layer cache as (arrays, JSON description); ValueError for a class not kept on disk."""
    arrays: Dict[str, mx.array] = {}
    layers = [_describe(layer, arrays) for layer in cache]
    return arrays, json.dumps(layers)


def decode_cache(arrays: Dict[str, mx.array], description: str) -> List[Any]:
    return [_rebuild(node, arrays) for node in json.loads(description)]


def _tokens_text(tokens: List[int]) -> str:
    return base64.b64encode(np.asarray(tokens, dtype="<i4").tobytes()).decode("ascii")


def _tokens_of(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<i4")


def file_name(tokens: List[int]) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).hexdigest()[:40] + SUFFIX


def read_header(path: Path) -> dict:
    """A safetensors file's metadata, read without its arrays (8-byte length, then JSON)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError("short header")
        (n,) = struct.unpack("<Q", head)
        if n > 1 << 28:
            raise ValueError("header too long")
        body = f.read(n)
        if len(body) != n:
            raise ValueError("short header")
        size = os.fstat(f.fileno()).st_size
    header = json.loads(body)
    meta = header.get("__metadata__") or {}
    # A torn file keeps its header: check that the arrays it names all fit in the file.
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        raise ValueError("truncated")
    return meta


def write_atomically(folder: Path, name: str, arrays: Dict[str, mx.array], metadata: Dict[str, str]) -> int:
    """Write one entry as `folder/name`: unique temporary file, fsync, rename. Its size in bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp{SUFFIX}"
    try:
        mx.save_safetensors(str(tmp), arrays, metadata)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        size = tmp.stat().st_size
        os.replace(tmp, folder / name)
    except BaseException:
        _remove(tmp)
        raise
    try:  # the rename itself survives a crash once the folder is synced
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
    return size


def _remove(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass  # another process removed it first


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
                    _, tier, name, arrays, metadata = job
                    size = write_atomically(tier.folder, name, arrays, metadata)
                    tier.written(name, metadata, size)
                    self.writes += 1
                self._keep_budget()
            except Exception:
                log.exception("prompt cache: a disk write failed")
            finally:
                with self._idle:
                    self._pending -= 1
                    self.queued_bytes -= nbytes
                    self._idle.notify_all()

    def _keep_budget(self) -> None:
        """Remove least recently used files until the folder is within the budget."""
        files, now = [], time.time()
        try:
            folders = [e for e in os.scandir(self.root) if e.is_dir()]
        except FileNotFoundError:
            folders = []
        for folder in folders:
            try:
                entries = list(os.scandir(folder.path))
            except FileNotFoundError:
                continue
            for e in entries:
                try:
                    st = e.stat()
                except FileNotFoundError:
                    continue  # another process removed it
                if e.name.startswith("."):
                    if e.name.endswith(".tmp" + SUFFIX) and now - st.st_mtime > STALE_TMP_S:
                        _remove(Path(e.path))
                    continue
                if e.name.endswith(SUFFIX):
                    files.append((st.st_mtime, st.st_size, e.path))
        total = sum(size for _, size, _ in files)
        files.sort()
        while total > self.budget and files:
            _, size, path = files.pop(0)
            _remove(Path(path))
            total -= size
        self.disk_bytes, self.disk_files = total, len(files)


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
        self.root, self.fingerprint, self.budget = root, model_fingerprint, budget
        self.folder = root / model_fingerprint
        self.writer = writer_for(root, budget)
        self._lock = threading.Lock()  # the index: the writer adds what it wrote
        self._index: Dict[str, _Known] = {}
        self._listed = None  # the folder's mtime when last listed
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
        try:
            meta = read_header(path)
            if meta.get("format") != FORMAT or meta.get("fingerprint") != self.fingerprint:
                raise ValueError("another format or model")
            return _Known(_tokens_of(meta["tokens"]), meta.get("trimmable") == "1",
                          meta.get("cache_type", "assistant"))
        except FileNotFoundError:
            return None
        except Exception as e:  # torn or foreign: never served, removed
            log.warning("prompt cache: removing unreadable file %s (%s)", name, e)
            _remove(path)
            return None

    def written(self, name: str, metadata: Dict[str, str], size: int) -> None:
        """The writer's report of a file now in place (writer thread)."""
        with self._lock:
            self._index[name] = _Known(_tokens_of(metadata["tokens"]), metadata["trimmable"] == "1",
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
            if meta.get("fingerprint") != self.fingerprint:
                raise ValueError("another model")
            arrays = mx.load(str(path))
            cache = decode_cache(arrays, meta["layers"])
            mx.eval([layer.state for layer in cache])
        except FileNotFoundError:  # another process's budget removed it meanwhile
            self._forget(name)
            return None
        except Exception as e:
            log.warning("prompt cache: removing unreadable file %s (%s)", name, e)
            _remove(path)
            self._forget(name)
            return None
        try:
            os.utime(path)
        except OSError:
            pass
        return [int(t) for t in _tokens_of(meta["tokens"])], cache, meta.get("cache_type", "assistant")

    def _forget(self, name: str) -> None:
        with self._lock:
            self._index.pop(name, None)

    # -- writes

    def save(self, tokens: List[int], cache: List[Any], cache_type: str) -> bool:
        """Queue one entry for writing (an existing file is only marked as used); False when
        this entry cannot be kept on disk."""
        if not tokens or not all(isinstance(t, int) for t in tokens):
            return False  # a vision prompt's keys hold image digests
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
        # The writer thread only copies buffers out: MLX runs nothing there (a thread of its
        # own has no stream to run on), so whatever is still lazy is computed here.
        mx.eval(list(arrays.values()))
        metadata = {"format": FORMAT, "fingerprint": self.fingerprint, "tokens": _tokens_text(tokens),
                    "trimmable": "1" if can_trim_prompt_cache(cache) else "0", "cache_type": cache_type,
                    "layers": layers}
        return self.writer.put(("write", self, name, arrays, metadata), sum(a.nbytes for a in arrays.values()))


# ---- the two tiers together ------------------------------------------------------


class _EvictionTrie(PromptTrie):
    """mlx-lm's trie, noting what LRUPromptCache evicts (its only use of `pop`)."""

    def __init__(self):
        super().__init__()
        self.evicted: List[Tuple[Any, List[int], Any]] = []

    def pop(self, model, tokens):
        entry = super().pop(model, tokens)
        self.evicted.append((model, tokens, entry))
        return entry


class PromptStore(LRUPromptCache):
    """LRUPromptCache with a disk tier behind it (`disk` None: memory only, as before)."""

    def __init__(self, max_size: int = 10, max_bytes: int = 1 << 63, disk: Optional[DiskTier] = None):
        super().__init__(max_size=max_size, max_bytes=max_bytes)
        self._trie = _EvictionTrie()
        self.disk = disk
        self.hits = {"memory": 0, "disk": 0}
        self.tokens_saved = 0
        self.source = "memory"  # where the last fetch's cache came from

    def fetch_nearest_cache(self, model, tokens):
        cache, rest = super().fetch_nearest_cache(model, tokens)
        served = len(tokens) - len(rest) if cache is not None else 0
        self.source = "memory"
        if self.disk is not None and served < len(tokens):
            if self._load_from_disk(model, tokens, served):
                again, again_rest = super().fetch_nearest_cache(model, tokens)
                if again is not None and len(tokens) - len(again_rest) > served:
                    cache, rest, self.source = again, again_rest, "disk"
        return cache, rest

    def count_hit(self, tokens: int) -> None:
        """A prompt started from the last fetch's cache with `tokens` of it (what the caller used:
        a whole-prompt hit gives back its last token, a second fetch may follow a first)."""
        if tokens > 0:
            self.hits[self.source] += 1
            self.tokens_saved += tokens

    def _load_from_disk(self, model, tokens, served: int) -> bool:
        try:
            best = self.disk.best(list(tokens), served)
            if best is None:
                return False
            got = self.disk.read(best[0])
        except Exception:  # the disk tier never fails a request: it only serves less
            log.exception("prompt cache: disk lookup failed")
            return False
        if got is None:
            return False
        entry_tokens, cache, cache_type = got
        self.insert_cache(model, entry_tokens, cache, cache_type=cache_type)
        return True

    def insert_cache(self, model, tokens, prompt_cache, *, cache_type: str = "assistant"):
        super().insert_cache(model, tokens, prompt_cache, cache_type=cache_type)
        self._spill()

    def trim_to(self, *, n_sequences=None, n_bytes=None):
        super().trim_to(n_sequences=n_sequences, n_bytes=n_bytes)
        self._spill()

    def _spill(self) -> None:
        """What memory just evicted goes to disk."""
        evicted, self._trie.evicted = self._trie.evicted, []
        if self.disk is None:
            return
        for _, tokens, entry in evicted:
            self._to_disk(tokens, entry.prompt_cache, entry.cache_type)

    def _to_disk(self, tokens, cache, cache_type) -> None:
        try:
            self.disk.save(list(tokens), cache, cache_type)
        except Exception:
            log.exception("prompt cache: queueing a disk write failed")

    def flush_to_disk(self) -> int:
        """Queue every entry still in memory for the disk, most recently used first (the batch
        closes: a model swap, the shutdown). How many were queued."""
        if self.disk is None:
            return 0
        queued = 0
        recent = []
        for cache_type in self._lru._ordering:
            recent.extend(reversed(self._lru._lrus[cache_type]))
        for model, tokens in recent:
            try:
                entry = self._trie.get(model, tokens)
            except KeyError:
                continue
            self._to_disk(tokens, entry.prompt_cache, entry.cache_type)
            queued += 1
        return queued

    def figures(self) -> Dict[str, int]:
        """For Status: entries, bytes, hits and prompt tokens served from the cache."""
        out = {"prompt_cache_entries": len(self), "prompt_cache_hits_memory": self.hits["memory"],
               "prompt_cache_hits_disk": self.hits["disk"], "prompt_cache_tokens_saved": self.tokens_saved}
        if self.disk is not None:
            out.update(prompt_cache_disk_entries=self.disk.entries,
                       prompt_cache_disk_bytes=self.disk.writer.disk_bytes,
                       prompt_cache_disk_files=self.disk.writer.disk_files)
        return out


def make_store(lm, max_size: int, max_bytes: int, disk_bytes: int) -> PromptStore:
    """The prefix cache of `lm`: a disk tier when `disk_bytes` > 0 and the folder can be made."""
    disk = None
    if disk_bytes > 0 and getattr(lm, "kind", "text") == "text":
        root = folder_root()
        try:
            root.mkdir(parents=True, exist_ok=True)
            disk = DiskTier(root, fingerprint(lm), disk_bytes)
        except OSError as e:
            log.warning("prompt cache: no disk tier (%s: %s)", root, e)
    return PromptStore(max_size=max_size, max_bytes=max_bytes, disk=disk)
