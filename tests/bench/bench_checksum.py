#!/usr/bin/env python3
"""What verifying a cache file costs against reading it (`python tests/bench/bench_checksum.py`).

Prefix-cache entries: float32 KV caches the size of SmolLM2-135M's (30 layers, 3 KV
heads of 64: 46 KB a token) at 450 and 2000 tokens (20.7 and 92 MB), written by the
disk tier's own writer. Per round, the read as DiskTier.read does it: `mx.load` and
`mx.eval` of the file's arrays (all a read was before checksums), then `check_arrays`
(the checksum it adds); once from the page cache (a file written or read recently) and
once after `posix_fadvise(DONTNEED)` dropped the file's pages (a read from the disk).
GGUF conversions: `checksums.file_digest` of a 98 MB file (SmolLM2's converted weights),
the read with its checksum, against a plain read of it in the same chunks.

First, the candidate hashes' speed in memory (the choice: store.py).
Prints ms per MB and the ratios, median [min..max] over the rounds. Nothing of the
server runs: the parts are timed on their own.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(REPO, "backend"), REPO]

LAYERS, KV_HEADS, HEAD_DIM = 30, 3, 64
GGUF_BYTES = 98 << 20


def _cache(tokens: int):
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    mx.random.seed(tokens)
    cache = []
    for _ in range(LAYERS):
        c = KVCache()
        c.keys, c.values = (mx.random.normal((1, KV_HEADS, tokens, HEAD_DIM)) for _ in range(2))
        c.offset = tokens
        cache.append(c)
    mx.eval([c.state for c in cache])
    return cache


def _drop_pages(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _entry_round(path: Path, cold: bool):
    """(load s, verify s, MB) of one read of a prefix-cache file."""
    import mlx.core as mx

    from engine.prefix.file_checks import check_arrays, read_header

    if cold:
        _drop_pages(path)
    meta = read_header(path)
    t0 = time.perf_counter()
    arrays = mx.load(str(path))
    mx.eval(list(arrays.values()))
    t1 = time.perf_counter()
    check_arrays(meta, arrays)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, path.stat().st_size / 1e6


def _plain_read(path) -> None:
    import store as checksums  # the store holds the digests

    buf = bytearray(checksums._CHUNK)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def _file_round(path: Path, cold: bool):
    """(plain read s, read with the checksum s, MB) of one GGUF conversion file."""
    import store as checksums  # the store holds the digests

    if cold:
        _drop_pages(path)
    t0 = time.perf_counter()
    _plain_read(path)
    t1 = time.perf_counter()
    if cold:
        _drop_pages(path)
    t2 = time.perf_counter()
    checksums.file_digest(path)
    t3 = time.perf_counter()
    return t1 - t0, t3 - t2, path.stat().st_size / 1e6


def _report(label: str, rounds, parts=("read", "verify")) -> None:
    first = [r[0] * 1e3 / r[2] for r in rounds]
    second = [r[1] * 1e3 / r[2] for r in rounds]
    ratio = sorted(r[1] / r[0] for r in rounds)
    print(f"{label:46s} {parts[0]} {statistics.median(first):5.2f} ms/MB, {parts[1]} "
          f"{statistics.median(second):5.2f} ms/MB: {parts[1]}/{parts[0]} {statistics.median(ratio):.2f}x "
          f"[{ratio[0]:.2f}..{ratio[-1]:.2f}]", flush=True)


def candidates(rounds: int) -> None:
    """GB/s of the hashes the checksum could have used, on 64 MB in memory (one core)."""
    import hashlib
    import zlib

    import xxhash

    data = os.urandom(64 << 20)
    for name, fn in (("xxh3_128 (xxhash)", lambda: xxhash.xxh3_128(data).digest()),
                     ("xxh3_64 (xxhash)", lambda: xxhash.xxh3_64(data).digest()),
                     ("crc32 (zlib)", lambda: zlib.crc32(data)),
                     ("sha256 (hashlib)", lambda: hashlib.sha256(data).digest()),
                     ("sha1 (hashlib)", lambda: hashlib.sha1(data).digest()),
                     ("blake2b (hashlib)", lambda: hashlib.blake2b(data).digest())):
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        print(f"hash {name:20s} {len(data) / min(times) / 1e9:5.2f} GB/s (best of {rounds})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    candidates(args.rounds)

    from engine.prefix import disk_tier
    from engine.prefix.cache_files import file_name
    from engine.prefix.disk_tier import DiskTier

    with tempfile.TemporaryDirectory(prefix="bench-checksum-") as tmp:
        tier = DiskTier(Path(tmp) / "prompt-cache", "b" * 32, 1 << 40)
        for tokens in (450, 2000):
            toks = list(range(1, tokens + 1))
            assert tier.save(toks, _cache(tokens), "assistant")
            assert disk_tier.drain_all(120)
            path = tier.folder / file_name(toks)
            for cold in (False, True):
                _entry_round(path, cold)  # warm-up
                rounds = [_entry_round(path, cold) for _ in range(args.rounds)]
                where = "disk" if cold else "page cache"
                _report(f"prefix entry {tokens} tokens ({path.stat().st_size / 1e6:.1f} MB), {where}", rounds)
        weights = Path(tmp) / "model.safetensors"
        with open(weights, "wb") as f:
            for _ in range(GGUF_BYTES >> 20):
                f.write(os.urandom(1 << 20))
        for cold in (False, True):
            _file_round(weights, cold)
            rounds = [_file_round(weights, cold) for _ in range(args.rounds)]
            _report(f"GGUF conversion ({GGUF_BYTES >> 20} MB file), {'disk' if cold else 'page cache'}", rounds,
                    ("read", "read+verify"))


if __name__ == "__main__":
    main()
