"""Lanes chosen by the check at load, kept on disk: a model is checked once per machine.

The check (lane_choice.py) runs a few short generations in each lane. What it finds depends
only on the model as loaded (prefix/cache_files.fingerprint: its files, config, dtype,
adapters, KV cache type and the libraries' versions), on how its batch runs (max_sequences,
prefill_batch_size, prefill_step_size), on the device and the BLAS, and on this backend's own
code (a digest of its source). Under that key the verdict is kept in the cache folder
(MLX_BACKEND_CACHE_DIR/lanes, one small JSON file per key, written atomically, private and
with the checksum of its verdict, as every cache file: loaders/private_files.py,
loaders/checksums.py), so the next load of the same model skips the comparison; the one
request through the chosen lane on the engine thread runs at every load. A file that cannot
be read or written only means the check runs again; a damaged one (a verdict that would put
a model in the wrong lane) is removed, counted in Status and the check runs again.
Loading thread.
"""

import functools
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Optional

from loaders import checksums
from loaders.loaded import Lane
from loaders.private_files import private_dir, private_file

log = logging.getLogger("mlx-backend.engine")

_BACKEND = Path(__file__).resolve().parents[1]  # backend/: the code whose behaviour the verdict is of


@functools.lru_cache(maxsize=None)
def _code_digest() -> str:
    """A digest of every Python file of this backend and of common/ (a few ms, once)."""
    digest = hashlib.sha256()
    for root in (_BACKEND, _BACKEND.parent / "common"):
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" not in path.parts and not path.name.startswith("backend_pb2"):
                digest.update(str(path.relative_to(root)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()


def _folder() -> Path:
    from loaders.gguf_loader import default_cache_dir

    return default_cache_dir().parent / "lanes"


def key(lm, config) -> str:
    import mlx.core as mx

    from common.openblas import preloaded
    from engine.prefix.cache_files import fingerprint

    parts = [fingerprint(lm), config.max_sequences, config.prefill_batch_size, config.prefill_step_size,
             str(mx.default_device()), preloaded(), _code_digest()]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


def _verdict(lane: Lane) -> dict:
    return {"solo": lane.solo, "prefill_alone": lane.prefill_alone, "reason": lane.reason}


def _sum(verdict: dict) -> str:
    return checksums.digest([json.dumps(verdict, sort_keys=True).encode()])


def read(lm, config) -> Optional[Lane]:
    """The lane the check chose at an earlier load of this model, or None."""
    path = _folder() / f"{key(lm, config)}.json"
    try:
        kept = json.loads(path.read_text())
        verdict = {k: kept[k] for k in ("solo", "prefill_alone", "reason")}
        if kept.get("checksum") != _sum(verdict):
            checksums.note_damaged(checksums.LANE_CACHE, path, "checksum mismatch", "removed; the check runs again")
            path.unlink(missing_ok=True)
            return None
        return Lane(solo=bool(verdict["solo"]), prefill_alone=bool(verdict["prefill_alone"]),
                    reason=str(verdict["reason"]))
    except FileNotFoundError:
        return None
    except Exception as e:  # unreadable or torn: the check runs again
        log.warning("lane: a kept verdict could not be read (%s: %s)", type(e).__name__, e)
        return None


def write(lm, config, lane: Lane) -> None:
    """Keep the check's verdict for the next load of this model."""
    folder = _folder()
    target = folder / f"{key(lm, config)}.json"
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    verdict = _verdict(lane)
    try:
        private_dir(folder)
        tmp.write_text(json.dumps(dict(verdict, checksum=_sum(verdict))))
        private_file(tmp)
        os.replace(tmp, target)
    except OSError as e:
        log.warning("lane: the verdict could not be kept (%s)", e)
        tmp.unlink(missing_ok=True)
