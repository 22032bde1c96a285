"""Rank 0's batch: the engine's TextBatch or solo lane, every call that changes it journaled to the followers."""

import logging
from typing import Dict, List, Optional

from engine.lanes.batch import Capabilities
from engine.lockstep.group import GroupLost
from engine.lockstep.wire import admit_wire

log = logging.getLogger("mlx-backend.lockstep")


class RecordingBatch:
    """The engine's TextBatch (or SoloBatch) on rank 0, journaling every call that changes it.

    Calls that run the model (admit, step) send the journal, themselves last,
    before they run here, so the followers run the same call at the same time.
    The KV caches the engine later saves are named by where they came from
    (a step, an admission, a removal), since each rank holds its own.
    """

    def __init__(self, inner, leader, settings: dict, probe: Optional[int] = None):
        self.inner = inner
        # Nothing runs apart from the journal (no speculation, no forward work reading the prefix
        # cache); the solo lane still runs one request at a time.
        self.capabilities = Capabilities(max_running=inner.capabilities.max_running)
        self.leader = leader
        # A lane check's batch (`probe`: the load id of the model it runs) is replayed in the
        # followers' probe slot: every op it journals says so.
        self._tag = {} if probe is None else {"p": probe}
        self.journal: List[dict] = []
        self._append({"k": "new", **settings})
        self._names: Dict[int, tuple] = {}  # id(cache) -> (name, cache), until the next model call
        self._store = getattr(inner, "cache", None)  # its prefix cache: what its bounds evict is journaled
        if self._store is not None:
            self._store.dropped = []

    def _append(self, op: dict) -> None:
        self.journal.append({**op, **self._tag})

    def _run(self, op: dict, fn):
        self._append(op)
        self.flush()
        self._names.clear()
        try:
            return fn()
        except Exception as e:
            if self.leader.lost or "[ring]" in str(e):
                raise GroupLost(self.leader.lost or str(e)) from e
            raise
        finally:
            self._dropped()

    def _dropped(self) -> None:
        """Journal what the prefix cache's bounds just evicted: the followers evict the same
        entries before their next call, so every rank starts each prompt from the same prefix."""
        if self._store is not None and self._store.dropped:
            keys, self._store.dropped = self._store.dropped, []
            self._append({"k": "drop", "keys": keys})

    def flush(self) -> None:
        if self.journal:
            ops, self.journal = self.journal, []
            self.leader.send({"k": "ops", "ops": ops})

    def _name(self, cache, name) -> None:
        if cache is not None:
            self._names[id(cache)] = (name, cache)

    @property
    def prefill_step_size(self) -> int:
        return self.inner.prefill_step_size

    def admit(self, prompt, max_tokens, sampling, extra, ignore_eos, on_error, direct=False, boundaries=(),
              request=None):
        op = admit_wire(prompt, max_tokens, sampling, extra, ignore_eos, direct)
        # Every rank stops its prefill at the same boundaries (the same passes, the same snapshots).
        op["b"] = list(boundaries)
        uid, cached, first = self._run(op, lambda: self.inner.admit(
            prompt, max_tokens, sampling, extra, ignore_eos, on_error, direct=direct, boundaries=boundaries))
        if first is not None:
            self._name(first.prompt_cache, ["a"])
        return uid, cached, first

    def step(self):
        responses = self._run({"k": "step"}, self.inner.step)
        for r in responses:
            self._name(getattr(r, "prompt_cache", None), ["s", r.uid])  # a Failed response has none
        return responses

    def remove(self, uids, keep_cache=False):
        self._append({"k": "remove", "uids": list(uids), "keep": keep_cache})
        kept = self.inner.remove(uids, keep_cache=keep_cache)
        for uid, (cache, _) in kept.items():
            self._name(cache, ["r", uid])
        return kept

    def waiting(self, n: int) -> None:
        pass

    def prefill_left(self, uid: int):
        return self.inner.prefill_left(uid)  # the leader's scheduler asks; what it decides is journaled

    def forget(self, uid: int) -> str:
        return ""

    def save(self, tokens, cache):
        named = self._names.get(id(cache))
        if named is None or named[1] is not cache:
            # A cache the followers cannot name: kept nowhere, so every rank's prefix cache stays the same.
            if cache is not None and tokens:
                log.warning("a prompt cache entry of unknown origin was not kept")
            return
        if tokens:
            self._append({"k": "save", "from": named[0]})
        self.inner.save(tokens, cache)
        self._dropped()

    def close(self):
        self._append({"k": "close"})
        self.flush()
        self.inner.close()

    @property
    def cache_bytes(self) -> int:
        return self.inner.cache_bytes

    def cache_figures(self) -> dict:
        return self.inner.cache_figures()
