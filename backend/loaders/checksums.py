"""Checksums of what the backend reads back from its own caches, and the count of damaged files.

A file read back from a cache (a prefix-cache entry, a converted GGUF model, a lane verdict) carries the
checksum of what was written, and is verified before any of it reaches the model: a disk
that flips bits must never turn into other text or another model. The hash is XXH3-128
(the `xxhash` package, already installed with mlx-vlm): measured here 2.8-5.8 GB/s on
one core, against 0.44-0.75 GB/s for SHA-256, 0.20-0.33 for BLAKE2b and 0.87-1.1 for
CRC-32 (zlib), and it releases the GIL on large buffers as hashlib does. What it guards
against is damage, not an attacker: the files sit in folders only this user can open
(private_files.py), and whoever can write there runs as this user anyway. 128 bits make
a damaged file that still matches out of the question. Verifying costs a fraction of
the read (docs/prefix-cache.md; tests/bench/bench_checksum.py).

A damaged file is a miss: its cache removes or rebuilds it, logs one line with its path
and counts it here; Status shows the counts since the process started.
"""

import logging
import struct
import threading
from typing import Dict, Iterable

import xxhash

log = logging.getLogger("mlx-backend.checksums")

ALGORITHM = "xxh3_128"
_CHUNK = 8 << 20  # file reads: large enough that the hash runs without the GIL, small enough to stay in cache

# The caches whose damaged files are counted, as Status names them.
PROMPT_CACHE = "prompt_cache_disk_corrupt"
GGUF_CACHE = "gguf_cache_corrupt"
LANE_CACHE = "lane_cache_corrupt"

_LABELS = {PROMPT_CACHE: "prompt cache", GGUF_CACHE: "GGUF cache", LANE_CACHE: "lane verdicts"}
_damaged: Dict[str, int] = {PROMPT_CACHE: 0, GGUF_CACHE: 0, LANE_CACHE: 0}
_damaged_lock = threading.Lock()


def digest(parts: Iterable) -> str:
    """The checksum of a sequence of byte strings or buffers, each framed by its length
    (so that moving bytes from one part to the next changes the result)."""
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


def note_damaged(cache: str, path, reason: str, then: str) -> None:
    """One damaged file of `cache` (PROMPT_CACHE, GGUF_CACHE): counted, and logged once with
    its path, why and what happens instead (`then`)."""
    with _damaged_lock:
        _damaged[cache] += 1
    log.warning("%s: %s is damaged (%s): %s", _LABELS[cache], path, reason, then)


def figures() -> Dict[str, int]:
    """For Status: damaged files found since the process started, per cache."""
    with _damaged_lock:
        return dict(_damaged)
