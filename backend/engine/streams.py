"""The streams of the served model, from their arrival to their last event (engine thread only).

Requests wait in order for their KV reservation and room in a step's prefill (admission.py),
run in the model's Batch (lanes/batch.py) one step at a time, and leave through `end`: the one
place a stream, or a forward job, gets its terminal event, exactly once. A failure is
confined to the request it belongs to whenever that request is known; failures become the
caller's errors in requests.failure.
"""

import logging
import time
from collections import deque
from typing import Deque, Dict, List, Optional

import store
from common.mlx_utils import TextPipeline
from engine import faults
from engine.admission import Admission
from engine.batch_factory import open_batch, prefill_sizes
from engine.lanes.batch import Failed
from engine.requests import EngineError, Event, Request, Sink, Slot, failure, refused

log = logging.getLogger("mlx-backend.engine")


class Streams:
    def __init__(self, outbox: List[tuple], metrics: dict, hooks):
        self.outbox = outbox  # (sink, event) the engine hands over at the end of its pass
        self.metrics = metrics
        self.hooks = hooks
        self.slots: Dict[int, Slot] = {}  # running, by batch uid
        self.waiting: Deque[Slot] = deque()
        self.batch = None  # the Batch of the current model, built on first use
        self.admission = Admission()
        self.faults = faults.Loop()  # tests only
        self.model = None
        self.config = None
        self.mx = self.stream = None  # set by the engine thread

    def serve(self, model, config) -> None:
        """From now on, for `model` (None: nothing) with `config`; the old streams have ended."""
        self.model, self.config = model, config
        self.admission.reset(model, config, self.mx)

    # ---- as the scheduler's Work (work.py) -------------------------------------------------

    @staticmethod
    def accepts(item) -> bool:
        return isinstance(item, Request)

    @property
    def pending(self) -> bool:
        return bool(self.slots or self.waiting)

    def first_arrival(self) -> Optional[float]:
        return self.waiting[0].t_arrived if self.waiting else None

    def run(self, flush, beat) -> None:
        """One turn: admit what fits, then one step of everything running."""
        self.admit()
        # A lone request's first token is sampled at admission (the direct path):
        # out now, not with the next step's (that cost its TTFT one decode step,
        # 60-90 ms of a ~240 ms warm TTFT on SmolLM2 f32, bench_prefix.py).
        flush()
        if self.slots:
            beat()  # Health times each call of the pass: admit, step, chunk
            self.step()

    def fail_all(self, error: EngineError, release: bool = True) -> None:
        """Every stream, waiting or running, ends with `error`; with `release` the batch is
        closed (its warm prefix-cache entries queued for the disk) and starts afresh."""
        for slot in list(self.waiting):
            self.end(slot, Event(error=error))
        if release:
            self.fail_running(error)
            return
        for slot in list(self.slots.values()):
            self.end(slot, Event(error=error))

    # ---- the way in ---------------------------------------------------------------------

    def refusal(self, model_epoch: int) -> Optional[EngineError]:
        """Why work prepared for model `model_epoch` cannot be taken, or None."""
        if self.model is None:
            return failure("not loaded")
        if model_epoch != self.model.epoch:
            return failure("reloaded")
        return None

    def enqueue(self, request: Request, sink: Sink) -> None:
        lm = self.model
        slot = Slot(request=request, sink=sink, pipeline=None, t_arrived=time.perf_counter())
        error = self.refusal(request.model_epoch)
        if error is None:
            slot.kv_bytes, why = self.admission.reserve(request, lm, self.config, self.places(),
                                                        len(self.slots), len(self.waiting))
            if why is not None:
                log.info("request %d refused: %s", request.id, why)
                error = refused(why)
        if error is not None:
            self.end(slot, Event(error=error))
            return
        slot.pipeline = TextPipeline(lm.detokenizer(), request.stops, request.router)
        self.waiting.append(slot)

    def cancel(self, request_id: int) -> bool:
        """Take a stream out (its last event: cancelled); whether it was here."""
        for slot in list(self.waiting) + list(self.slots.values()):
            if slot.request.id != request_id:
                continue
            if slot.uid not in self.slots:
                self.end(slot, slot.event(finish="cancelled"))
                return True
            # Only a request that reached decoding has a cache known to be whole
            # (a prompt batch mid-prefill may still hold padding).
            cache, tokens = self._take(slot, keep_cache=bool(slot.t_first))
            self._finish(slot, "cancelled", [], cache, tokens)
            return True
        return False

    def admit(self) -> None:
        if not self.waiting:
            return
        self.open().waiting(len(self.waiting))  # company: a stream running apart comes back
        sizes = prefill_sizes(self.config, self.mx)
        while self.waiting and len(self.slots) < self.places():
            slot = self.waiting[0]  # stays in the queue, where a failure still finds it, until placed
            if not self.admission.fits(slot, self.slots.values()):  # it waits (in order) for running ones to end
                break
            if not self.admission.prefill_fits(slot, self.slots.values(), sizes, self._prefill_left):
                break  # it waits (in order) for a step's prefill to have room
            req = slot.request
            slot.t_admit = time.perf_counter()
            # Alone, a short rest is prefilled at once and its first token sampled directly.
            direct = not self.slots and len(self.waiting) == 1
            try:
                self.faults.at_admission(req)  # tests only
                uid, slot.cached, first = self.open().admit(
                    req.prompt, req.max_tokens, req.sampling, req.processors, req.ignore_eos,
                    on_error=lambda e, slot=slot: _sampling_failed(slot, e), direct=direct,
                    boundaries=req.boundaries, request=req,
                    **({"media": req.media} if req.media is not None else {}))
            except Exception as e:  # this request alone: the batch is as it was
                log.exception("request %d: admission failed", req.id)
                self.end(slot, Event(error=failure("admission", e)))
                continue
            self.waiting.popleft()
            if uid >= 0:
                slot.uid = uid
                self.slots[uid] = slot
            self.metrics["prompt_tokens_processed"] += len(req.prompt) - slot.cached
            log.debug("request %d admitted: %d prompt tokens, %d cached", req.id, len(req.prompt), slot.cached)
            if first is not None and slot.error is None:
                self._token(slot, first)
            if slot.error is not None:  # its sampler, processors or pipeline failed on the first token
                self._fail(slot, slot.error)

    def _prefill_left(self, slot: Slot) -> Optional[int]:
        return self.batch.prefill_left(slot.uid)

    def places(self) -> int:
        """How many requests may run at once: max_sequences, or fewer when the lane says so."""
        most = self.open().capabilities.max_running
        return min(self.config.max_sequences, most) if most else self.config.max_sequences

    def open(self):
        """The model's batch, built on first use."""
        if self.batch is None:
            from engine.prefix import disk_tier

            budget = self.config.prompt_cache_disk_bytes
            disk = disk_tier.default_disk_bytes(store.PROMPTS.base()) if budget is None else budget
            batch = open_batch(self.model, self.config, self.stream, self.mx,
                               disk_bytes=disk if self.hooks.disk_tier else 0, speculate=self.hooks.speculate)
            self.batch = self.hooks.wrap(batch, self.config)
        return self.batch

    # ---- one step -----------------------------------------------------------------------

    def step(self) -> None:
        started = time.perf_counter()
        produced = 0
        self.batch.waiting(len(self.waiting))
        for r in self.batch.step():
            slot = self.slots.get(r.uid)
            if isinstance(r, Failed):
                if slot is not None:
                    log.error("request %d: %s failed", slot.request.id, r.what, exc_info=r.error)
                    slot.error = slot.error or failure(r.what, r.error)
                continue
            produced += 1
            if slot is not None and not slot.done and slot.error is None:
                self._token(slot, r)
        for slot in [s for s in self.slots.values() if s.error is not None]:
            self._fail(slot, slot.error)
        if produced:
            self.metrics["tokens_generated"] += produced
            rate = produced / max(time.perf_counter() - started, 1e-6)
            self.metrics["tokens_per_second"] = 0.8 * self.metrics["tokens_per_second"] + 0.2 * rate

    def _token(self, slot: Slot, r) -> None:
        try:
            self._on_token(slot, r)
        except Exception as e:  # this request's text pipeline: it alone fails
            log.exception("request %d failed on token %d", slot.request.id, r.token)
            slot.error = slot.error or failure("token", e)

    def _on_token(self, slot: Slot, r) -> None:
        """One generated token of one request."""
        if not slot.t_first:
            slot.t_first = time.perf_counter()
        if r.finish_reason == "stop":  # an end-of-sequence token: not text
            self._finish(slot, "stop", slot.pipeline.finalize(), r.prompt_cache, r.all_tokens)
            return
        slot.tokens += 1
        if slot.request.logprobs:
            from engine.lanes.logprobs import entry

            slot.logprobs.append(entry(self.model.tokenizer, r.token, r.logprobs, slot.request.top_logprobs))
        deltas = slot.pipeline.add_token(r.token)
        if slot.pipeline.stopped:  # a stop string: out of the batch, its cache kept
            cache, tokens = self._take(slot, keep_cache=True)
            self._finish(slot, "stop", deltas + slot.pipeline.finalize(), cache, tokens)
        elif r.finish_reason == "length":
            self._finish(slot, "length", deltas + slot.pipeline.finalize(), r.prompt_cache, r.all_tokens)
        elif deltas:
            self.outbox.append((slot.sink, slot.event(deltas)))

    # ---- the way out ----------------------------------------------------------------------

    def _take(self, slot: Slot, keep_cache: bool):
        """Take a running request out of the batch: (its cache, tokens) or Nones."""
        return self.batch.remove([slot.uid], keep_cache=keep_cache).get(slot.uid, (None, None))

    def end(self, who, event) -> None:
        """The one place a stream (its Slot) or a forward job (its Sink) leaves the engine:
        its terminal event or result, exactly once."""
        if not isinstance(who, Slot):
            self.outbox.append((who, event))
            return
        slot = who
        if slot.done:
            return
        slot.done = True
        if self.slots.pop(slot.uid, None) is not None and self.batch is not None:
            slot.note = self.batch.forget(slot.uid)
        try:
            self.waiting.remove(slot)
        except ValueError:
            pass
        self.outbox.append((slot.sink, event))
        if event.error is not None:
            log.info("request %d%s failed: %s: %s", slot.request.id, slot.label, event.error.code, event.error)
        else:
            log.info("request %d%s %s: prompt %d tokens (%d cached), completion %d tokens, "
                     "prefill %.0f ms, decode %.0f ms%s%s", slot.request.id, slot.label, event.finish,
                     event.prompt_tokens, event.cached_tokens, event.tokens, event.prompt_ms, event.gen_ms,
                     f" ({event.tokens * 1000.0 / event.gen_ms:.1f} tok/s)" if event.gen_ms > 0 else "",
                     slot.note)

    def _fail(self, slot: Slot, error: EngineError) -> None:
        """This request alone failed: out of the batch, then its error."""
        try:
            if slot.uid in self.slots and self.batch is not None:
                self._take(slot, keep_cache=False)
        finally:  # if the batch cannot let go of it, the step's handler resets the batch
            self.end(slot, Event(error=error))

    def _finish(self, slot: Slot, reason: str, deltas, cache=None, tokens=None) -> None:
        """A normal end; its KV cache is kept for later prompts when it is whole."""
        try:
            faults.check(slot.request, "cache")  # tests only
            self.batch.save(tokens, cache)
        except Exception:  # the reply is complete: losing its cache entry must not fail it
            log.exception("request %d: keeping its prompt cache failed", slot.request.id)
        finally:
            self.end(slot, slot.event(deltas, finish=reason))

    def fail_running(self, error: EngineError) -> None:
        """The batch itself failed: its requests end with `error`, waiting ones start afresh."""
        for slot in list(self.slots.values()):
            self.end(slot, Event(error=error))
        self.slots.clear()
        if self.batch is not None:
            self.batch.close()
        self.batch = None


def _sampling_failed(slot: Slot, e: Exception) -> None:
    log.error("request %d: its sampler or logits processor failed", slot.request.id, exc_info=e)
    if slot.error is None:
        slot.error = failure("sampling", e)
