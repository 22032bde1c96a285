"""Speculation as a batch: the text batch, with a lone stream decoding speculatively apart.

The scheduler sees one Batch. When exactly one request runs, none waits, it has its first
token and it can speculate (its capability check below), its KV cache leaves the inner batch
and speculate.Solo decodes it, several tokens a pass; when company arrives (`waiting`) or its
drafts keep failing, it goes back into the inner batch with its cache (`_rejoin`). A
request keeps its uid throughout: the inner batch's new uid after a rejoin is mapped back.
Engine thread only.
"""

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from engine.lanes.batch import Capabilities, Failed
from engine.speculation import speculate

log = logging.getLogger("mlx-backend.engine")


@dataclass(eq=False)
class _Stream:
    """One request as speculation follows it (Solo reads `request`, `uid` and `spec`)."""
    request: Any
    uid: int
    on_error: Callable[[Exception], None]
    generated: List[int] = field(default_factory=list)  # token ids so far (drafts look back at them)
    started: bool = False  # its first token was produced
    running: bool = True  # in the inner batch or in Solo
    spec: Any = None  # speculate.Track, once it has decoded speculatively


class SpeculatingBatch:
    capabilities = Capabilities(speculate=True, shares_prefix=True)

    def __init__(self, inner, lm, stream):
        self.inner = inner
        self.lm = lm
        self.stream = stream
        self.settings = speculate.settings_of(lm)
        self._streams: Dict[int, _Stream] = {}  # by our uid (the inner batch's at admission)
        self._ours: Dict[int, int] = {}  # inner uid after a rejoin -> our uid
        self._inner: Dict[int, int] = {}  # our uid -> inner uid, after a rejoin
        self._solo: Optional[speculate.Solo] = None
        self._waiting = 0

    # ---- what passes through ---------------------------------------------------

    @property
    def prefill_step_size(self) -> int:
        return self.inner.prefill_step_size

    @property
    def cache(self):
        return self.inner.cache

    @property
    def gen(self):
        return self.inner.gen

    @property
    def cache_bytes(self) -> int:
        return self.inner.cache_bytes

    def cache_figures(self) -> dict:
        return self.inner.cache_figures()

    def save(self, tokens, cache) -> None:
        self.inner.save(tokens, cache)

    def live_cache(self, uid: int):
        return self.inner.live_cache(self._inner.get(uid, uid))

    def admit(self, prompt, max_tokens, sampling, extra, ignore_eos, on_error, direct=False, boundaries=(),
              request=None, **media):
        uid, cached, first = self.inner.admit(prompt, max_tokens, sampling, extra, ignore_eos, on_error,
                                              direct=direct, boundaries=boundaries, **media)
        if uid >= 0:
            self._streams[uid] = _Stream(request, uid, on_error)
        if first is not None:
            self._seen(first)
        return uid, cached, first

    def waiting(self, n: int) -> None:
        self._waiting = n
        self.inner.waiting(n)
        if n and self._solo is not None:  # company: the lone stream goes back into the batch
            self._rejoin()

    def remove(self, uids, keep_cache=False):
        out, rest = {}, []
        for uid in uids:
            s = self._streams.get(uid)
            if s is not None:
                s.running = False
            if self._solo is not None and self._solo.uid == uid:
                solo, self._solo = self._solo, None
                out[uid] = solo.release() if keep_cache else (None, None)
            else:
                rest.append(uid)
        if rest:
            inner = self.inner.remove([self._inner.get(u, u) for u in rest], keep_cache=keep_cache)
            out.update({self._ours.get(u, u): v for u, v in inner.items()})
        return out

    def prefill_left(self, uid: int) -> Optional[int]:
        if self._solo is not None and self._solo.uid == uid:
            return None  # decoding apart
        return self.inner.prefill_left(self._inner.get(uid, uid))

    def forget(self, uid: int) -> str:
        if self._solo is not None and self._solo.uid == uid:
            self._solo = None
        s = self._streams.pop(uid, None)
        inner = self._inner.pop(uid, None)
        self._ours.pop(inner, None)
        return s.spec.summary() if s is not None and s.spec is not None else ""

    def close(self) -> None:
        self._solo = None
        self._streams.clear()
        self.inner.close()

    # ---- one step -----------------------------------------------------------------

    def step(self):
        if self._solo is None and not self._start():
            for r in self.inner.step():
                r.uid = self._ours.get(r.uid, r.uid)
                self._seen(r)
                yield r
            return
        solo = self._solo
        try:
            for r in solo.step():
                self._seen(r)
                if r.finish_reason is not None and self._solo is solo:  # it ended: its cache is in r
                    self._solo = None
                yield r
                if self._solo is not solo:  # taken out (a stop string, a failure): its cache is given
                    return
        except Exception as e:  # this request alone: nothing else runs
            yield Failed(solo.uid, "speculative step", e)
            return
        if self._solo is solo and solo.wants_batch:
            self._rejoin()

    def _seen(self, r) -> None:
        s = self._streams.get(r.uid)
        if s is None:
            return
        s.started = True
        if r.finish_reason == "stop":  # an end-of-sequence token: not text
            s.running = False
            return
        s.generated.append(r.token)
        if r.finish_reason is not None:
            s.running = False

    def _start(self) -> bool:
        """Whether this step decodes the one running request speculatively (leaving the batch)."""
        running = [s for s in self._streams.values() if s.running]
        if len(running) != 1 or self._waiting:
            return False
        s = running[0]
        if not s.started or (s.spec is not None and not s.spec.ready(len(s.generated))):
            return False
        req = s.request
        # A vision request's cache carries its image positions, and with a KV cache type a
        # verification pass (its chunk attends in float) would not be bit-exact: both stay in the batch.
        plain = req is not None and req.media is None and self.lm.kv is None
        n_draft = speculate.draft_length(self.settings, req) if plain else 0
        if n_draft > 0 and not speculate.can_start(self.live_cache(s.uid)):
            n_draft = 0  # its own cache cannot take drafts back (a recurrent state, a full window)
        if n_draft <= 0:
            s.spec = speculate.Track.never()  # decided once for this request
            return False
        inner_uid = self._inner.pop(s.uid, s.uid)
        self._ours.pop(inner_uid, None)
        cache, _ = self.inner.remove([inner_uid], keep_cache=True).get(inner_uid, (None, None))
        context = req.prompt + s.generated
        self._solo = speculate.Solo(self.lm, self.settings, s, cache, context,
                                    req.max_tokens - len(s.generated), n_draft, self.stream)
        return True

    def _rejoin(self) -> None:
        solo, self._solo = self._solo, None
        s = solo.slot
        inner_uid = solo.rejoin(self.inner.gen, s.on_error)
        if inner_uid != s.uid:
            self._inner[s.uid] = inner_uid
            self._ours[inner_uid] = s.uid
