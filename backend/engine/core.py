"""The engine: one thread owns the model and every MLX call; this is its scheduler.

Work enters as typed commands through a thread-safe inbox (requests.py: Submit, Cancel,
Swap, Stop, Lost; forward.Forward) and leaves as Events, handed to the event loop once per
pass for all requests together. Streams run in one Batch (batch.py: the text or vision
batch, speculation and lockstep wrap it), each with its own sampler, logits processors,
token budget and text pipeline; forward work (embeddings, scores) runs a bounded chunk
between two steps. Admission and the KV budget are admission.py's; what a variant of the
engine changes (lockstep) comes in as Hooks.

Every request gets exactly one terminal event (a finish or an error) on every path: `_end`
is the only place a stream or a forward job leaves the engine, failures become errors in
one place (requests.failure), and a failure is confined to the request it belongs to
whenever that request is known.
"""

import asyncio
import concurrent.futures
import contextlib
import gc
import itertools
import logging
import queue
import sys
import threading
import time
from collections import deque
from typing import Any, AsyncIterator, Callable, Deque, Dict, List, Optional

from common.mlx_utils import TextPipeline
from engine import faults
from engine.admission import Admission
from engine.batch import Failed, open_batch
from engine.config import EngineConfig
from engine.forward import Cancelled, Forward, ForwardWork, chunk_plan
from engine.hooks import Hooks
from engine.requests import (Cancel, EngineError, Event, Lost, Request, Sink, Slot, Stop, Submit, Swap, deliver,
                             failure, refused, stopped)

__all__ = ["Engine", "EngineConfig", "EngineError", "Event", "Request", "Stop"]

log = logging.getLogger("mlx-backend.engine")

# The longest the first request of a burst waits for the rest, known to be in
# preparation, to be prefilled with them. Preparing takes a few ms a request,
# on a loaded machine (2 prep threads, 8 requests) up to ~200 ms were seen.
COALESCE_S = 0.1
# ... and it waits until no request has reached the servicer for this long: the
# calls of a burst arrive a fraction of a millisecond apart, but the first can be
# prepared before the next arrives. A lone request pays it once.
QUIET_S = 0.003

PROMPT_CACHE_DRAIN_S = 2.0  # at shutdown, the longest the prefix cache's disk writes may take
LOOP_BACKOFF_MAX_S = 0.5  # the longest pause between two passes of a loop that keeps failing


def _backoff(failures: int) -> float:
    return min(0.001 * 2 ** (failures - 2), LOOP_BACKOFF_MAX_S)


class Engine:
    def __init__(self, config: EngineConfig = None, hooks: Hooks = None):
        self.config = config or EngineConfig()
        self.hooks = hooks or Hooks()
        self.model = None  # model_loader.LoadedModel: read by any thread, swapped by the engine thread
        self.memory: Dict[str, int] = {}
        self.metrics = {"tokens_generated": 0, "prompt_tokens_processed": 0, "tokens_per_second": 0.0}
        self.dead: Optional[str] = None  # why the engine thread ended, once it has
        self.preparing = 0  # requests the servicer is preparing: about to arrive
        self.last_arrival = 0.0  # perf_counter when the servicer last began preparing one
        self._lock = threading.Lock()  # orders submissions against the engine's death
        self._inbox: "queue.SimpleQueue" = queue.SimpleQueue()
        self._ids = itertools.count(1)
        self._slots: Dict[int, Slot] = {}  # running, by batch uid
        self._waiting: Deque[Slot] = deque()
        self._outbox: List[tuple] = []  # (sink, event) to hand over at the end of the pass
        self._text = None  # the Batch of the current model, built on first use
        self._forward = ForwardWork()  # embeddings and scores, run a chunk at a time between steps
        self._admission = Admission()
        self._faults = faults.Loop()
        self._stopping = False
        # For Health (read from the event loop): when the current pass began, whether the thread
        # is only waiting for work, and since when every pass has failed.
        self._beat = time.monotonic()
        self._idle = False
        self._failing_since: Optional[float] = None
        self.on_close: Optional[Callable[[str], None]] = None  # told, from the engine thread, why it ended
        self._thread = threading.Thread(target=self._run, name="mlx-engine", daemon=True)
        self._thread.start()

    # ---- called from any thread -------------------------------------------

    @property
    def busy(self) -> bool:
        return bool(self._slots or self._waiting or self._forward.pending)

    @contextlib.contextmanager
    def arriving(self):
        """Around the servicer's preparation of a request: the engine may hold a burst's first
        request (or forward job) for it, to run them in one pass."""
        self.preparing += 1
        self.last_arrival = time.perf_counter()
        try:
            yield
        finally:
            self.preparing -= 1

    @property
    def alive(self) -> bool:
        return self.dead is None and self._thread.is_alive()

    def trouble(self) -> Optional[str]:
        """Why the engine cannot serve (dead, failing every pass or stuck in one pass for longer
        than health_timeout), or None. Any thread; Health turns not-serving on it."""
        if not self.alive:
            return f"the engine has stopped ({self.dead or 'gone'})"
        now, limit = time.monotonic(), self.config.health_timeout
        since = self._failing_since
        if since is not None and now - since > limit:
            return f"every engine pass has failed for {now - since:.1f}s (bound: option health_timeout={limit:g}s)"
        idle, beat = self._idle, self._beat  # idle first: see _drain_inbox
        if not idle and now - beat > limit:
            return (f"the engine has been inside one call for {now - beat:.1f}s "
                    f"(bound: option health_timeout={limit:g}s)")
        return None

    def _put(self, command) -> None:
        with self._lock:
            if self.dead is not None:
                raise EngineError("UNAVAILABLE", f"mlx: the engine has stopped ({self.dead})")
            self._inbox.put(command)

    def swap(self, model, config: Optional[EngineConfig] = None) -> concurrent.futures.Future:
        """Serve `model` from the next step on (None frees the current one)."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._put(Swap(model, config, done))
        return done

    async def forward(self, job) -> Any:
        """Run a forward job (forward.EmbedJob / ScoreJob / PairJob); its result, or raises
        EngineError. The job gets an id: cancel(job.id) takes it out, as setting job.cancelled does."""
        sink = Sink(asyncio.get_running_loop())
        job.id = next(self._ids)
        self._put(Forward(job, sink))
        result = await sink.queue.get()
        if isinstance(result, Event):
            raise result.error
        return result

    async def stream(self, request: Request) -> AsyncIterator[Event]:
        """Submit a request; yields its Events until the last one (finish set)."""
        sink = Sink(asyncio.get_running_loop())
        request.id = next(self._ids)
        self._put(Submit(request, sink))
        done = False
        try:
            while not done:
                ev = await sink.queue.get()
                done = ev.finish is not None or ev.error is not None
                if ev.error is not None:
                    raise ev.error
                yield ev
        finally:
            if not done:  # the client left: free the slot at the next step
                self.cancel(request.id)

    def cancel(self, request_id: int) -> None:
        """Take a stream or a forward job out at the next pass (a no-op once it has finished)."""
        try:
            self._put(Cancel(request_id))
        except EngineError:
            pass  # a dead engine holds no request

    def stop(self, timeout: float = 10.0) -> None:
        try:
            self._put(Stop())
        except EngineError:
            return
        self._thread.join(timeout=timeout)

    def lose(self, error: BaseException) -> None:
        """Nothing running can go on (a lockstep group lost a rank): the engine ends with `error`
        at its next command, whichever thread calls this."""
        self._inbox.put(Lost(error))

    def abandon(self, cause: str) -> None:
        """From another thread, when the engine thread is stuck for good (in a collective that
        will never return): mark it dead and tell every request it held, best effort. The
        engine's own state is only read: its thread will not run again."""
        with self._lock:
            self.dead = cause
        error = stopped(cause)
        items = [(s.sink, Event(error=error)) for s in list(self._slots.values()) + list(self._waiting)
                 if not s.done]
        _hand_over(items)

    # ---- engine thread: the loop ------------------------------------------

    def _run(self) -> None:
        cause = "stopped"
        try:
            import mlx.core as mx

            self._mx = mx
            self._stream = mx.default_stream(mx.default_device())
            last_mem, failures = 0.0, 0
            while not self._stopping:
                self._beat = now = time.monotonic()
                try:
                    self._faults.at_pass(now)  # tests only: a fault on every pass
                    idle = not self.busy
                    if idle or now - last_mem > 0.5:  # fresh figures for Status, cheap
                        self._update_memory()
                        last_mem = now
                    self._pass(idle)
                    failures, self._failing_since = 0, None
                except Exception:  # a bug in the batch as a whole: fail what runs, keep serving
                    failures += 1
                    self._failing_since = self._failing_since or self._beat
                    self._loop_failed(failures)
                finally:
                    self._flush()
        except BaseException as e:
            cause = f"the engine thread died: {type(e).__name__}: {e}"
            log.critical("%s; every request now fails with UNAVAILABLE", cause, exc_info=True)
        finally:
            self._close(cause)

    def _pass(self, idle: bool) -> None:
        """Commands, admission, one step of the batch, one chunk of forward work."""
        self._drain_inbox(None if idle else self._hold())
        self._flush()
        if not self._hold():
            self._admit()
            # A lone request's first token is sampled at admission (the direct path):
            # out now, not with the next step's (that cost its TTFT one decode step,
            # 60-90 ms of a ~240 ms warm TTFT on SmolLM2 f32, bench_prefix.py).
            self._flush()
        if self._slots:
            self._beat = time.monotonic()  # Health times each call of the pass: admit, step, chunk
            self._step()
        self._beat = time.monotonic()
        if self._forward.pending and not self._hold():
            self._forward_chunk()

    def _loop_failed(self, failures: int) -> None:
        """A pass of the loop raised (`failures` passes in a row): fail what runs, keep serving.

        A fault that recurs on every pass must neither flood the log nor spin a core:
        the first one is logged with its traceback, repeats at 2, 4, 8... in a row, and
        the loop pauses 1 ms, 2 ms, 4 ms... (at most LOOP_BACKOFF_MAX_S) before the next pass.
        """
        if failures == 1:
            log.exception("engine step failed; failing the running requests")
        elif failures & (failures - 1) == 0:
            log.error("engine step failed %d times in a row (%s); pausing %.0f ms between passes",
                      failures, sys.exc_info()[1], _backoff(failures) * 1000)
        self._fail_running(failure("loop"))
        if failures > 1:
            time.sleep(_backoff(failures))

    def _close(self, cause: str) -> None:
        """No command is accepted any more; everything still inside gets its last event."""
        cause = self.hooks.close_cause(cause)
        with self._lock:
            self.dead = cause
        error = stopped(cause)
        for slot in list(self._slots.values()) + list(self._waiting):
            self._end(slot, Event(error=error))
        for sink, _ in self._forward.drop_all():
            self._end(sink, Event(error=error))
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(command, (Submit, Forward)):
                self._end(command.sink, Event(error=error))
            elif isinstance(command, Swap):
                command.done.set_exception(error)
        self._flush()
        if self.on_close is not None:
            try:
                self.on_close(cause)
            except Exception:
                log.exception("on_close failed")
        self.hooks.closed()

    def _flush(self) -> None:
        """Hand this pass's events to their loops: one wake-up per loop, not one per token."""
        if self._outbox:
            if not self.busy and getattr(self, "_mx", None) is not None:  # the last events: what Status reads is current first
                self._update_memory()
            batch, self._outbox = self._outbox, []
            _hand_over(batch)
        self.hooks.flushed(self._text)

    def _hold(self) -> float:
        """How long a lone request waits for others arriving, to be prefilled with them.

        Requests of a burst reach the engine as each is prepared; admitted one by
        one, the first would be prefilled alone and the rest in a second pass that
        stalls it anyway (seen in bench logs: 1 + 7 of 8 streams, 3 + 5; 2 + 30 of 32
        embeddings). So the oldest waits while others are being prepared and until
        arrivals pause for QUIET_S, at most COALESCE_S. Nothing waits while the batch runs.
        """
        if self._slots:
            return 0.0
        now = time.perf_counter()
        quiet = float("inf") if self.preparing > 0 else self.last_arrival + QUIET_S
        firsts = [t for t in (self._waiting[0].t_arrived if self._waiting else None,
                              self._forward.first_arrival()) if t is not None]
        return max([0.0] + [min(t + COALESCE_S, quiet) - now for t in firsts])

    def _drain_inbox(self, timeout: Optional[float]) -> None:
        """Handle every command in the inbox, first waiting up to `timeout` (None: forever) for one."""
        self._idle = timeout is None  # nothing to do until a command arrives: not stuck
        try:
            command = self._inbox.get(timeout=timeout) if timeout != 0 else self._inbox.get_nowait()
        except queue.Empty:
            return
        finally:
            self._beat = time.monotonic()  # before _idle clears, so Health never sees a stale beat
            self._idle = False
        while True:
            self._handle(command)
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, command) -> None:
        if isinstance(command, Submit):
            self._enqueue(command.request, command.sink)
        elif isinstance(command, Forward):
            self._enqueue_forward(command)
        elif isinstance(command, Cancel):
            self._cancel(command.request_id)
        elif isinstance(command, Swap):
            if command.done.set_running_or_notify_cancel():
                try:
                    self._swap(command.model, command.config)
                    self._beat = time.monotonic()  # a slow swap (its full collection) is no stuck pass
                    command.done.set_result(command.model)
                except BaseException as e:  # delivered to the caller, then the engine goes on
                    command.done.set_exception(e)
                    if not isinstance(e, Exception):
                        raise
        elif isinstance(command, Stop):
            # Closing the batch queues its warm prefix-cache entries for the disk.
            self._fail_all(failure("shutdown"))
            self._stopping = True
            self._keep_prompt_cache()
            self.hooks.stopped()
        elif isinstance(command, Lost):
            raise command.error

    def _keep_prompt_cache(self) -> None:
        """Let the prefix cache's disk writes finish, within the engine's stop time (backend.py
        joins this thread for ENGINE_STOP_S): the most recently used entries were queued first."""
        from engine import disk_tier

        if not disk_tier.drain_all(PROMPT_CACHE_DRAIN_S):
            log.warning("prompt cache: shutting down with disk writes still queued")

    # ---- a request's way in -------------------------------------------------------

    def _refusal(self, model_epoch: int) -> Optional[EngineError]:
        """Why work prepared for model `model_epoch` cannot be taken, or None."""
        if self.model is None:
            return failure("not loaded")
        if model_epoch != self.model.epoch:
            return failure("reloaded")
        return None

    def _enqueue(self, request: Request, sink: Sink) -> None:
        lm = self.model
        slot = Slot(request=request, sink=sink, pipeline=None, t_arrived=time.perf_counter())
        error = self._refusal(request.model_epoch)
        if error is None:
            slot.kv_bytes, why = self._admission.reserve(request, lm, self.config, len(self._slots),
                                                         len(self._waiting))
            if why is not None:
                log.info("request %d refused: %s", request.id, why)
                error = refused(why)
        if error is not None:
            self._end(slot, Event(error=error))
            return
        slot.pipeline = TextPipeline(lm.detokenizer(), request.stops, request.router)
        self._waiting.append(slot)

    def _enqueue_forward(self, command: Forward) -> None:
        error = self.hooks.forward_refusal() or self._refusal(command.job.model_epoch)
        if error is not None:
            self._end(command.sink, Event(error=error))
        else:
            self._forward.add(command.job, command.sink)

    def _cancel(self, request_id: int) -> None:
        if self._forward.cancel(request_id):
            return  # it leaves at the next chunk, with the jobs dropped there
        for slot in list(self._waiting) + list(self._slots.values()):
            if slot.request.id != request_id:
                continue
            if slot.uid not in self._slots:
                self._end(slot, slot.event(finish="cancelled"))
                return
            # Only a request that reached decoding has a cache known to be whole
            # (a prompt batch mid-prefill may still hold padding).
            cache, tokens = self._take(slot, keep_cache=bool(slot.t_first))
            self._finish(slot, "cancelled", [], cache, tokens)
            return

    def _admit(self) -> None:
        if self._waiting:
            self._batch().waiting(len(self._waiting))  # company: a stream running apart comes back
        while self._waiting and len(self._slots) < self.config.max_sequences:
            slot = self._waiting[0]  # stays in the queue, where a failure still finds it, until placed
            if not self._admission.fits(slot, self._slots.values()):  # it waits (in order) for running ones to end
                break
            req = slot.request
            slot.t_admit = time.perf_counter()
            # Alone, a short rest is prefilled at once and its first token sampled directly.
            direct = not self._slots and len(self._waiting) == 1
            try:
                self._faults.at_admission(req)  # tests only
                uid, slot.cached, first = self._batch().admit(
                    req.prompt, req.max_tokens, req.sampling, req.processors, req.ignore_eos,
                    on_error=lambda e, slot=slot: self._sampling_failed(slot, e), direct=direct,
                    boundaries=req.boundaries, request=req,
                    **({"media": req.media} if req.media is not None else {}))
            except Exception as e:  # this request alone: the batch is as it was
                log.exception("request %d: admission failed", req.id)
                self._end(slot, Event(error=failure("admission", e)))
                continue
            self._waiting.popleft()
            if uid >= 0:
                slot.uid = uid
                self._slots[uid] = slot
            self.metrics["prompt_tokens_processed"] += len(req.prompt) - slot.cached
            log.debug("request %d admitted: %d prompt tokens, %d cached", req.id, len(req.prompt), slot.cached)
            if first is not None and slot.error is None:
                self._token(slot, first)
            if slot.error is not None:  # its sampler, processors or pipeline failed on the first token
                self._fail(slot, slot.error)

    def _batch(self):
        if self._text is None:
            from engine import disk_tier

            budget = self.config.prompt_cache_disk_bytes
            disk = disk_tier.default_disk_bytes(disk_tier.folder_root()) if budget is None else budget
            batch = open_batch(self.model, self.config, self._stream, self._mx,
                               disk_bytes=disk if self.hooks.disk_tier else 0, speculate=self.hooks.speculate)
            self._text = self.hooks.wrap(batch, self.config)
        return self._text

    @staticmethod
    def _sampling_failed(slot: Slot, e: Exception) -> None:
        log.error("request %d: its sampler or logits processor failed", slot.request.id, exc_info=e)
        if slot.error is None:
            slot.error = failure("sampling", e)

    # ---- one step -------------------------------------------------------------------

    def _step(self) -> None:
        started = time.perf_counter()
        produced = 0
        batch = self._text
        batch.waiting(len(self._waiting))
        for r in batch.step():
            slot = self._slots.get(r.uid)
            if isinstance(r, Failed):
                if slot is not None:
                    log.error("request %d: %s failed", slot.request.id, r.what, exc_info=r.error)
                    slot.error = slot.error or failure(r.what, r.error)
                continue
            produced += 1
            if slot is not None and not slot.done and slot.error is None:
                self._token(slot, r)
        for slot in [s for s in self._slots.values() if s.error is not None]:
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
            from engine.logprobs import entry

            slot.logprobs.append(entry(self.model.tokenizer, r.token, r.logprobs, slot.request.top_logprobs))
        deltas = slot.pipeline.add_token(r.token)
        if slot.pipeline.stopped:  # a stop string: out of the batch, its cache kept
            cache, tokens = self._take(slot, keep_cache=True)
            self._finish(slot, "stop", deltas + slot.pipeline.finalize(), cache, tokens)
        elif r.finish_reason == "length":
            self._finish(slot, "length", deltas + slot.pipeline.finalize(), r.prompt_cache, r.all_tokens)
        elif deltas:
            self._outbox.append((slot.sink, slot.event(deltas)))

    # ---- a request's way out ----------------------------------------------------------

    def _take(self, slot: Slot, keep_cache: bool):
        """Take a running request out of the batch: (its cache, tokens) or Nones."""
        return self._text.remove([slot.uid], keep_cache=keep_cache).get(slot.uid, (None, None))

    def _end(self, who, event) -> None:
        """The one place a stream (its Slot) or a forward job (its Sink) leaves the engine:
        its terminal event or result, exactly once."""
        if not isinstance(who, Slot):
            self._outbox.append((who, event))
            return
        slot = who
        if slot.done:
            return
        slot.done = True
        if self._slots.pop(slot.uid, None) is not None and self._text is not None:
            slot.note = self._text.forget(slot.uid)
        try:
            self._waiting.remove(slot)
        except ValueError:
            pass
        self._outbox.append((slot.sink, event))
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
            if slot.uid in self._slots and self._text is not None:
                self._take(slot, keep_cache=False)
        finally:  # if the batch cannot let go of it, the step's handler resets the batch
            self._end(slot, Event(error=error))

    def _finish(self, slot: Slot, reason: str, deltas, cache=None, tokens=None) -> None:
        """A normal end; its KV cache is kept for later prompts when it is whole."""
        try:
            faults.check(slot.request, "cache")  # tests only
            self._text.save(tokens, cache)
        except Exception:  # the reply is complete: losing its cache entry must not fail it
            log.exception("request %d: keeping its prompt cache failed", slot.request.id)
        finally:
            self._end(slot, slot.event(deltas, finish=reason))

    def _fail_running(self, error: EngineError) -> None:
        """The batch itself failed: its requests end with `error`, waiting ones start afresh."""
        for slot in list(self._slots.values()):
            self._end(slot, Event(error=error))
        self._reset_batch()

    def _fail_all(self, error: EngineError) -> None:
        for slot in list(self._waiting):
            self._end(slot, Event(error=error))
        for sink, _ in self._forward.drop_all():
            self._end(sink, Event(error=error))
        self._fail_running(error)

    def _reset_batch(self) -> None:
        self._slots.clear()
        if self._text is not None:
            self._text.close()
        self._text = None

    # ---- forward work ---------------------------------------------------------------------

    def _forward_chunk(self) -> None:
        """One bounded chunk of embedding / score work (forward.py), between two decode steps."""
        budget, prefix = chunk_plan(self.model, self.config.forward_chunk_tokens, self._batch)
        try:
            done = self._forward.run_chunk(self.model, budget, prefix, self._stream)
        except Exception as e:  # outside any one job (each job's own failure is returned): fail them all
            log.exception("forward work failed")
            done = [(sink, e) for sink, _ in self._forward.drop_all()]
        for sink, result in done:
            if isinstance(result, Cancelled):
                result = Event(error=failure("cancelled"))
            elif isinstance(result, Exception):
                result = Event(error=failure("forward", result))
            self._end(sink, result)

    # ---- the model ------------------------------------------------------------------------

    def _update_memory(self) -> None:
        mx = self._mx
        self.memory = {
            "active": mx.get_active_memory(),
            "cache": mx.get_cache_memory(),
            "peak": mx.get_peak_memory(),
            "prompt_cache": self._text.cache_bytes if self._text is not None else 0,
            # Entries, hits (memory, disk), prompt tokens served from it, its files (prompt_store).
            **(self._text.cache_figures() if self._text is not None else {}),
            # What one cached token costs (kv_cache: quantized or float16 when asked for).
            "kv_bytes_per_token": getattr(self.model, "kv_bytes_per_token", 0),
            "kv_bytes_per_token_float": getattr(self.model, "kv_bytes_per_token_float", 0),
        }
        self.hooks.memory(self.memory)

    def _swap(self, model, config: Optional[EngineConfig]) -> None:
        """Drop the current model, its batch and caches; serve `model` (may be None)."""
        self._fail_all(failure("swapped"))
        self.model = None
        gc.unfreeze()  # what the old model froze can be collected again
        gc.collect()
        self._mx.clear_cache()
        if config is not None:
            self.config = config
        self.model = model
        self._admission.reset(model, self.config, self._mx)
        # The model's objects live as long as it does: frozen, a full collection skips them and
        # walks only what requests create. Unfrozen, each walked ~460k objects (SmolLM2 with its
        # tokenizer), ~200 ms holding the GIL: a stall of every stream a few times a minute.
        gc.freeze()
        self._update_memory()
        self.hooks.swapped(model)


def _hand_over(items) -> None:
    """Each (sink, event) to its sink's loop: one wake-up per loop."""
    by_loop: Dict[Any, list] = {}
    for sink, event in items:
        by_loop.setdefault(sink.loop, []).append((sink, event))
    for loop, batch in by_loop.items():
        try:
            loop.call_soon_threadsafe(deliver, batch)
        except RuntimeError:  # the loop is gone (shutdown): nobody listens
            pass
