"""Whether a prefix-cache file is what was written, before anything of it is served.

Each file carries two checksums in its metadata (store.digest): one of the
metadata itself (tokens, how to rebuild the cache, format, model), checked whenever a
header is read (the index, a read), and one of its arrays (names, dtypes, shapes and
bytes), checked once they are loaded and before they become a cache. Together they cover
the whole file: a flipped byte in the tensor table moves an array's bytes, changes its
dtype or shape, or breaks the header. A file whose bytes are not what was written is
Damaged; one of another format or model is Foreign. Any thread.
"""

import json
import os
import struct
from pathlib import Path
from typing import Dict, Tuple

import mlx.core as mx

from engine.prefix.cache_files import FORMAT
import store

META_SUM, DATA_SUM = "meta_sum", "data_sum"


class Damaged(ValueError):
    """A file of this format whose bytes are not the ones written (torn, flipped, cut short)."""


class Foreign(ValueError):
    """A whole file that is not ours to read: another format, or another model's."""


# Bytes per element of the safetensors dtypes MLX writes.
_ITEM_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "I16": 2, "F16": 2,
               "BF16": 2, "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8, "C64": 8}


def read_header(path: Path) -> dict:
    """A safetensors file's metadata, read without its arrays (8-byte length, then JSON).

    Damaged unless the header parses and every array it names has the bytes its dtype and
    shape need, inside the file: what MLX's loader is then given is at least well formed
    (the checksums say whether it is what was written)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise Damaged("short header")
        (n,) = struct.unpack("<Q", head)
        if n > 1 << 28:
            raise Damaged("header too long")
        body = f.read(n)
        if len(body) != n:
            raise Damaged("short header")
        size = os.fstat(f.fileno()).st_size
    try:
        header = json.loads(body)
        meta = header.pop("__metadata__", None) or {}
        spans = [_span(t) for t in header.values()]
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise Damaged(f"unreadable header: {type(e).__name__}: {e}") from None
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise Damaged("unreadable metadata")
    # A torn file keeps its header: the arrays it names must all fit in the file.
    if 8 + n + max((end for _, end in spans), default=0) > size:
        raise Damaged("truncated")
    return meta


def _span(tensor: dict) -> Tuple[int, int]:
    """An array's (begin, end) in the data, checked against its dtype and shape."""
    begin, end = (int(x) for x in tensor["data_offsets"])
    count = 1
    for d in tensor["shape"]:
        if int(d) < 0:
            raise ValueError("a negative dimension")
        count *= int(d)
    if not 0 <= begin <= end or end - begin != count * _ITEM_BYTES[tensor["dtype"]]:
        raise ValueError("an array's bytes do not match its dtype and shape")
    return begin, end


# ---- checksums ------------------------------------------------------------------


def _array_parts(arrays: Dict[str, mx.array]):
    for name in sorted(arrays):
        a = arrays[name]
        yield f"{name}|{a.dtype}|{tuple(a.shape)}".encode()
        yield memoryview(a)  # the buffer itself: evaluated and contiguous (no copy, no MLX work)


def arrays_sum(arrays: Dict[str, mx.array]) -> str:
    """The checksum of a file's arrays: their names, dtypes, shapes and bytes, the same before
    the write (any thread) and after a load."""
    return store.digest(_array_parts(arrays))


def _meta_sum(meta: Dict[str, str]) -> str:
    rest = {k: v for k, v in meta.items() if k != META_SUM}
    return store.digest([json.dumps(rest, sort_keys=True).encode()])


def seal(metadata: Dict[str, str], arrays: Dict[str, mx.array]) -> Dict[str, str]:
    """`metadata` with the checksums of `arrays` and of itself, as written in the file."""
    out = dict(metadata, **{DATA_SUM: arrays_sum(arrays)})
    out[META_SUM] = _meta_sum(out)
    return out


def check_header(meta: Dict[str, str], model_fingerprint: str) -> None:
    """Foreign for a file of another format or model; Damaged when its metadata is not what
    was written."""
    if meta.get("format") != FORMAT:
        raise Foreign(f"format {meta.get('format')!r}, not {FORMAT!r}")
    if meta.get(META_SUM) != _meta_sum(meta):
        raise Damaged("its metadata fails its checksum")
    if meta.get("fingerprint") != model_fingerprint:
        raise Foreign("another model's")


def check_arrays(meta: Dict[str, str], arrays: Dict[str, mx.array]) -> None:
    """Damaged unless the loaded (evaluated) arrays are the ones written."""
    if arrays_sum(arrays) != meta.get(DATA_SUM):
        raise Damaged("its arrays fail their checksum")
