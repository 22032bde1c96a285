"""The prefix cache's files: one entry per safetensors file, and the model's fingerprint.

Each file holds one entry's arrays and, in its safetensors metadata, its tokens and
how to rebuild its cache objects, mlx-lm's classes and ours (engine/kv/kv_rows.py,
a vision model's MediaState) alike (mlx-lm's own loader finds classes in its module
only). Tokens are little-endian int64, in the metadata and in the file name's hash:
a vision model's prompts are keyed with their media tokens replaced by negative
62-bit content hashes (media.keyed_tokens), which int32 cannot hold. Files appear
as the store writes every file (store.py: atomic, synced, private), so processes sharing
a folder never see a partial one; each file carries checksums (file_checks.py).
The fingerprint keys a folder to the model as loaded (weights by name, size and mtime,
config, dtype, adapters and their scales, KV cache type, a vision model's video frame
sampling, the library versions). Any thread.
"""

import base64
import functools
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import mlx.core as mx
import numpy as np
from mlx_lm.models import cache as lm_cache

import store

# 3: checksums of the metadata and of the arrays (2 had none: flipped bytes became other
# text); 2: tokens as int64 (1 had int32). The format is part of the fingerprint, so files
# of earlier formats sit in folders of other fingerprints: never read, and the first removed
# by the byte budget (least recently used).
FORMAT = "mlx-backend-prompt-cache/3"
SUFFIX = ".safetensors"
TOKEN_DTYPE = "<i8"


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


@functools.lru_cache(maxsize=None)
def _versions(kind: str) -> Dict[str, str]:
    """The libraries whose code computes the cache: an upgrade may change it bit for bit
    (for a vision model, the image processor too). Once per process: 2-3 ms measured here."""
    from importlib import metadata

    names = ["mlx", "mlx-lm"] + (["mlx-vlm", "transformers"] if kind == "vision" else [])
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = ""
    return out


def fingerprint(lm) -> str:
    """A key for everything about the loaded model that changes its KV cache.

    Cheap on purpose (a listing and a stat per file, no weight read: well under
    a millisecond for a model directory), and computed when the batch is built,
    not in LoadModel. Adapter directories are stat'ed the same way. A vision model's
    processor files are in its directory (its .json files) and its vision config in
    `config`; the processor's library versions and its video frame sampling are added.
    """
    kv = getattr(lm, "kv", None)
    kind = getattr(lm, "kind", "text")
    vision = getattr(lm, "vision", None)
    parts = {
        "format": FORMAT,
        "source": os.path.abspath(lm.source) if os.path.exists(lm.source) else lm.source,
        "files": _files_of(lm.source),
        "config": lm.config,
        "dtype": lm.dtype,
        "kind": kind,
        # The same video bytes (the same key) give other frames under other sampling options.
        "media": None if vision is None else getattr(vision, "extra", None),
        "versions": _versions(kind),
        "adapters": [(os.path.abspath(a), _files_of(a)) for a in getattr(lm, "adapters", [])],
        "adapter_scales": list(getattr(lm, "adapter_scales", [])),
        "kv": None if kv is None else [kv.bits, kv.group_size, kv.dtype],
    }
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# ---- cache objects <-> arrays and a description ------------------------------


def _class_tag(layer) -> Optional[str]:
    """How a cache class is named in the file (None: a class this format does not know)."""
    # Our classes' modules are looked up, not imported: one not imported yet made no layer,
    # and an import here (seconds for mlx-vlm's, on a loaded machine) held the shutdown's
    # last writes past the engine's stop time: the warm entries never reached the disk.
    kv_rows = sys.modules.get("engine.kv.kv_rows")
    vision = sys.modules.get("loaders.vision_model")
    cls = type(layer)
    if vision is not None and cls is vision.MediaState:
        return "ours:MediaState"
    if kv_rows is not None and isinstance(layer, kv_rows.CastRow):
        return f"cast:{str(cls.dtype).rsplit('.', 1)[-1]}"
    if kv_rows is not None and cls is kv_rows.QuantizedRow:
        return "ours:QuantizedRow"
    if getattr(lm_cache, cls.__name__, None) is cls:
        return f"mlx_lm:{cls.__name__}"
    return None


def _class_of(tag: str):
    from engine.kv import kv_rows
    from loaders.vision_model import MediaState

    kind, name = tag.split(":", 1)
    if kind == "ours" and name == "MediaState":
        return MediaState
    if kind == "cast":
        return kv_rows.row_class(getattr(mx, name))
    if kind == "ours" and name == "QuantizedRow":
        return kv_rows.QuantizedRow
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
    if tag == "ours:MediaState":  # no arrays: per row, the mRoPE delta and the media-keyed prompt
        return {"c": tag, "deltas": [int(d) for d in layer.deltas], "keys": [tokens_text(k) for k in layer.keys]}
    return {"c": tag, "state": _encode(layer.state, arrays)}


def _rebuild(node: dict, arrays: Dict[str, mx.array]):
    cls = _class_of(node["c"])
    if cls is lm_cache.CacheList:
        return lm_cache.CacheList(*(_rebuild(p, arrays) for p in node["parts"]))
    if node["c"] == "ours:MediaState":
        layer = cls.__new__(cls)  # its __init__ would make an empty row list one row
        layer.deltas = [int(d) for d in node["deltas"]]
        layer.keys = [[int(t) for t in tokens_of(k)] for k in node["keys"]]
        return layer
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


def tokens_text(tokens: List[int]) -> str:
    return base64.b64encode(np.asarray(tokens, dtype=TOKEN_DTYPE).tobytes()).decode("ascii")


def tokens_of(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=TOKEN_DTYPE)


def file_name(tokens: List[int]) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype=TOKEN_DTYPE).tobytes()).hexdigest()[:40] + SUFFIX


# ---- writing ----------------------------------------------------------------------


def write_atomically(folder: Path, name: str, arrays: Dict[str, mx.array], metadata: Dict[str, str]) -> int:
    """Write one entry as `folder/name` (store.write_file: atomic, synced, 0600). Its size in
    bytes. The folder is made private when missing (a purge while running)."""
    store.private_dir(folder)
    return store.PROMPTS.write_file(folder, name, lambda tmp: mx.save_safetensors(str(tmp), arrays, metadata))
