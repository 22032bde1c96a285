"""Lanes chosen by the check at load, kept on disk: a model is checked once per machine.

The check (lane_choice.py) runs a few short generations in each lane. What it finds depends
only on the model as loaded (prefix/cache_files.fingerprint: its files, config, dtype,
adapters, KV cache type and the libraries' versions), on how its batch runs (max_sequences,
prefill_batch_size, prefill_step_size), on the device and the BLAS, and on the lane code (a
digest of the files of LANE_CODE, not of the whole backend: an upgrade that leaves the lanes
as they were keeps every verdict). Under that key the verdict is kept in the cache folder
(the store's `lanes/`, one small JSON file per key, kept as the store keeps everything: private,
atomic, with its checksum: store.py), so the next load of the same model skips the comparison;
the one request through the chosen lane on the engine thread runs at every load. A file that
cannot be read or written only means the check runs again (a fault counted in Status); a
damaged one (a verdict that would put a model in the wrong lane) is removed, counted in Status
and the check runs again.
Loading thread.
"""

import functools
import hashlib
import json
import logging
from pathlib import Path
from typing import Optional

import store
from loaders.loaded import Lane

log = logging.getLogger("mlx-backend.engine")

_BACKEND = Path(__file__).resolve().parents[1]  # backend/
# The code a verdict is of: what runs a lane, what decides between them, the probes it is
# decided on. A change anywhere else in the backend (the servicer, audio, the loaders) leaves
# the kept verdicts standing; a change here checks every model again at its next load.
LANE_CODE = ("engine/lanes", "engine/kv", "engine/lockstep", "engine/lane_choice.py", "engine/lane_probe.py",
             "engine/lane_tolerance.py", "engine/batch_factory.py", "engine/admission.py", "engine/streams.py",
             "prepare/probe.py", "loaders/cache_kinds.py", "loaders/rounding.py")


@functools.lru_cache(maxsize=None)
def code_digest(backend: Path = _BACKEND) -> str:
    """A digest of the lane code's Python files under `backend` (a few ms, once)."""
    digest = hashlib.sha256()
    for part in LANE_CODE:
        top = backend / part
        for path in sorted(top.rglob("*.py")) if top.is_dir() else [top]:
            if "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(backend)).encode())
                digest.update(path.read_bytes() if path.exists() else b"(none)")
    return digest.hexdigest()


def key(lm, config) -> str:
    import mlx.core as mx

    from common.openblas import preloaded
    from engine.prefix.cache_files import fingerprint

    parts = [fingerprint(lm), config.max_sequences, config.prefill_batch_size, config.prefill_step_size,
             str(mx.default_device()), preloaded(), code_digest(), lm.parallel, lm.ranks]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


def _verdict(lane: Lane) -> dict:
    return {"solo": lane.solo, "prefill_alone": lane.prefill_alone, "reason": lane.reason}


def read(lm, config) -> Optional[Lane]:
    """The lane the check chose at an earlier load of this model, or None."""
    kept = store.LANES.load(f"{key(lm, config)}.json")
    if kept is None:
        return None
    try:
        verdict = json.loads(kept)
        return Lane(solo=bool(verdict["solo"]), prefill_alone=bool(verdict["prefill_alone"]),
                    reason=str(verdict["reason"]))
    except (ValueError, KeyError, TypeError) as e:  # a verdict of another version: checked again
        log.warning("lane: a kept verdict could not be read (%s: %s)", type(e).__name__, e)
        return None


def write(lm, config, lane: Lane) -> None:
    """Keep the check's verdict for the next load of this model (a fault is a miss: store.py)."""
    store.LANES.save(f"{key(lm, config)}.json", json.dumps(_verdict(lane)).encode())
