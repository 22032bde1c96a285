"""The engine: one thread owns the model and every MLX call; this is its scheduler.

Work enters as typed commands through a thread-safe inbox (requests.py: Submit, Cancel,
Swap, Trial, Decide, Stop, Lost) and leaves as Events, handed to the event loop once per pass for all
requests together. The scheduler drives every kind of work through one interface (work.py)
and never asks which kind it holds: the streams (streams.py: generation in one Batch,
batch.py, which speculation and lockstep wrap; admission.py's queue and KV budget) and
forward jobs (forward_queue.py: embeddings, scores, a bounded chunk between two steps).
What a variant of the engine changes (lockstep) comes in as Hooks.

Every request gets exactly one terminal event (a finish or an error) on every path:
Streams.end is the only place a stream or a forward job leaves the engine, failures become
errors in one place (requests.failure), and a failure is confined to the request it
belongs to whenever that request is known.
"""

import asyncio
import concurrent.futures
import contextlib
import gc
import itertools
import logging
import queue
import threading
import time
from typing import Any, AsyncIterator, Callable, Dict, List, Optional

from engine import device_setup
from engine.audio import AudioDone
from engine.audio_queue import AudioQueue
from engine.config import EngineConfig
from engine.forward_queue import ForwardQueue
from engine.health import Pulse
from engine import lane_choice
from engine.hooks import Hooks
from engine.requests import (
    Cancel, Decide, EngineError, Event, Lost, Request, Sink, Stop, Submit, Swap, Trial, failure, hand_over, stopped)
from engine.streams import Streams
import store

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
        self._outbox: List[tuple] = []  # (sink, event) to hand over at the end of the pass
        self._streams = Streams(self._outbox, self.metrics, self.hooks)
        # Every kind of work, driven alike (work.py), a turn each per pass in this order:
        # the streams' admission and step, a slice of each audio job (transcriptions, speech,
        # voice activity), then a chunk of forward jobs (embeddings, scores).
        self._audio = AudioQueue(self._streams)
        self._forward = ForwardQueue(self._streams, self.hooks)
        self._work = [self._streams, self._audio, self._forward]
        self._stopping = False
        self._pulse = Pulse()  # for Health, read from the event loop
        self.on_close: Optional[Callable[[str], None]] = None  # told, from the engine thread, why it ended
        self._thread = threading.Thread(target=self._run, name="mlx-engine", daemon=True)
        self._thread.start()

    # ---- called from any thread -------------------------------------------

    @property
    def busy(self) -> bool:
        return any(work.pending for work in self._work)

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
        return self._pulse.trouble(self.config.health_timeout)

    def _put(self, command) -> None:
        with self._lock:
            if self.dead is not None:
                raise stopped(f"the engine has stopped ({self.dead})")
            self._inbox.put(command)

    @property
    def distributed(self) -> bool:
        """Whether the model runs across ranks (the lockstep engine): there the lane check runs on
        the engine thread (Engine.decide), only the text batch runs, and no draft model is served."""
        return False

    def load(self, spec):
        """Load the model `spec` names for this engine (the loading thread, while the engine keeps
        serving the old one): one process loads it whole (loaders/model_loader.py)."""
        from loaders import model_loader

        return model_loader.load(spec)

    def swap(self, model, config: Optional[EngineConfig] = None) -> concurrent.futures.Future:
        """Serve `model` from the next step on (None frees the current one)."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._put(Swap(model, config, done))
        return done

    def trial(self, model, lane, config: EngineConfig, requests, fallback: bool) -> concurrent.futures.Future:
        """Run `model` (loaded, not yet served) through `lane` with `requests` on the engine
        thread, where its requests will run (lane_choice.trial): the future's result is the lane
        that serves it, its exception why none does. The served model's streams pause meanwhile
        (a few tokens)."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._put(Trial(model, lane, config, requests, fallback, done))
        return done

    def decide(self, model, config: EngineConfig, probes, forced: str) -> concurrent.futures.Future:
        """The lane check (lane_choice.decide) of `model` run on the engine thread, as across ranks
        it must be (its probes' collectives in step with the served batch's); one process runs it
        on the loading thread instead. The served model's streams pause meanwhile."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._put(Decide(model, config, probes, forced, done))
        return done

    async def forward(self, job) -> Any:
        """Run a forward job (forward.EmbedJob / ScoreJob / PairJob); its result, or raises
        EngineError. The job gets an id: cancel(job.id) takes it out, as setting job.cancelled does."""
        sink = Sink(asyncio.get_running_loop())
        job.id = next(self._ids)
        self._put(Submit(job, sink))
        result = await sink.queue.get()
        if isinstance(result, Event):
            raise result.error
        return result

    async def audio(self, job) -> AsyncIterator[Any]:
        """Submit an audio job (engine/audio); yields each AudioPart it makes, then its AudioDone;
        raises EngineError. Cancelled when the caller stops reading before the end."""
        sink = Sink(asyncio.get_running_loop())
        job.id = next(self._ids)
        self._put(Submit(job, sink))
        done = False
        try:
            while not done:
                item = await sink.queue.get()
                if isinstance(item, Event):
                    done = True
                    raise item.error
                done = isinstance(item, AudioDone)
                yield item
        finally:
            if not done:  # the client left: the job ends at its next turn
                self.cancel(job.id)

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
        items = [(s.sink, Event(error=error)) for s in list(self._streams.slots.values()) + list(self._streams.waiting)
                 if not s.done]
        hand_over(items)

    # ---- engine thread: the loop ------------------------------------------

    def _run(self) -> None:
        cause = "stopped"
        try:
            import mlx.core as mx

            self._mx = mx
            self._device = device_setup.apply(mx)  # the wired limit on Metal, as mlx_lm.server sets it
            # The default stream, as mlx_lm.server's one generation thread uses (device_setup.py).
            self._stream = mx.default_stream(mx.default_device())
            self._streams.mx, self._streams.stream = mx, self._stream
            self._forward.mx_stream = self._audio.mx_stream = self._stream
            last_mem = 0.0
            while not self._stopping:
                self._pulse.beat = now = time.monotonic()
                try:
                    self._streams.faults.at_pass(now)  # tests only: a fault on every pass
                    idle = not self.busy
                    if idle or now - last_mem > 0.5:  # fresh figures for Status, cheap
                        self._update_memory()
                        last_mem = now
                    self._pass(idle)
                    self._pulse.passed()
                except Exception:  # a bug in the batch as a whole: fail what runs, keep serving
                    self._pulse.failed()
                    self._streams.fail_running(failure("loop"))
                    self._pulse.pause()
                finally:
                    self._flush()
        except BaseException as e:
            cause = f"the engine thread died: {type(e).__name__}: {e}"
            log.critical("%s; every request now fails with UNAVAILABLE", cause, exc_info=True)
        finally:
            self._close(cause)

    def _pass(self, idle: bool) -> None:
        """Commands, then a turn of each kind of work (unless a burst is being held for)."""
        self._drain_inbox(None if idle else self._hold())
        self._flush()
        for work in self._work:
            if self._hold():  # (asked again after each turn: the streams may have just ended)
                return
            self._pulse.beat = time.monotonic()  # Health times each call of the pass
            work.run(self._flush, self._beat)

    def _beat(self) -> None:
        self._pulse.beat = time.monotonic()

    def _close(self, cause: str) -> None:
        """No command is accepted any more; everything still inside gets its last event."""
        cause = self.hooks.close_cause(cause)
        with self._lock:
            self.dead = cause
        error = stopped(cause)
        for work in self._work:
            work.fail_all(error, release=False)  # the thread is ending: nothing more is run
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(command, Submit):
                self._streams.end(command.sink, Event(error=error))
            elif isinstance(command, (Swap, Trial, Decide)):
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
            batch = list(self._outbox)
            self._outbox.clear()
            hand_over(batch)
        self.hooks.flushed(self._streams.batch)

    def _hold(self) -> float:
        """How long a lone request waits for others arriving, to be prefilled with them.

        Requests of a burst reach the engine as each is prepared; admitted one by
        one, the first would be prefilled alone and the rest in a second pass that
        stalls it anyway (seen in bench logs: 1 + 7 of 8 streams, 3 + 5; 2 + 30 of 32
        embeddings). So the oldest waits while others are being prepared and until
        arrivals pause for QUIET_S, at most COALESCE_S. Nothing waits while the batch runs.
        """
        if self._streams.slots:
            return 0.0
        now = time.perf_counter()
        quiet = float("inf") if self.preparing > 0 else self.last_arrival + QUIET_S
        firsts = [t for t in (work.first_arrival() for work in self._work) if t is not None]
        return max([0.0] + [min(t + COALESCE_S, quiet) - now for t in firsts])

    def _drain_inbox(self, timeout: Optional[float]) -> None:
        """Handle every command in the inbox, first waiting up to `timeout` (None: forever) for one."""
        self._pulse.idle = timeout is None  # nothing to do until a command arrives: not stuck
        try:
            command = self._inbox.get(timeout=timeout) if timeout != 0 else self._inbox.get_nowait()
        except queue.Empty:
            return
        finally:
            self._pulse.beat = time.monotonic()  # before idle clears, so Health never sees a stale beat
            self._pulse.idle = False
        while True:
            self._handle(command)
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, command) -> None:
        if isinstance(command, Submit):
            next(w for w in self._work if w.accepts(command.item)).enqueue(command.item, command.sink)
        elif isinstance(command, Cancel):
            any(work.cancel(command.request_id) for work in self._work)  # the first that holds it
        elif isinstance(command, Swap):
            self._answer(command.done, lambda: self._swap(command.model, command.config))
        elif isinstance(command, Trial):
            self._answer(command.done, lambda: lane_choice.trial(
                command.model, command.lane, command.config or self.config, command.requests, self._stream,
                self._beat, command.fallback, hooks=self.hooks.probe(command.model)))
        elif isinstance(command, Decide):
            self._answer(command.done, lambda: lane_choice.decide(
                command.model, command.config, command.probes, command.forced,
                hooks=self.hooks.probe(command.model), beat=self._beat))
        elif isinstance(command, Stop):
            # Closing the batch queues its warm prefix-cache entries for the disk.
            self._fail_all(failure("shutdown"))
            self._stopping = True
            self._keep_prompt_cache()
            self.hooks.stopped()
        elif isinstance(command, Lost):
            raise command.error

    def _answer(self, done: concurrent.futures.Future, fn: Callable[[], Any]) -> None:
        """Run a command that answers through `done`: what `fn` returns, or what it raised."""
        if not done.set_running_or_notify_cancel():
            return
        try:
            result = fn()
            self._pulse.beat = time.monotonic()  # a slow command (a swap's full collection) is no stuck pass
            done.set_result(result)
        except BaseException as e:  # delivered to the caller, then the engine goes on
            done.set_exception(e)
            if not isinstance(e, Exception):
                raise

    def _keep_prompt_cache(self) -> None:
        """Let the prefix cache's disk writes finish, within the engine's stop time (backend.py
        joins this thread for ENGINE_STOP_S): the most recently used entries were queued first."""
        from engine.prefix import disk_tier

        if not disk_tier.drain_all(PROMPT_CACHE_DRAIN_S):
            log.warning("prompt cache: shutting down with disk writes still queued")

    def _fail_all(self, error: EngineError) -> None:
        for work in self._work:
            work.fail_all(error)

    # ---- the model ------------------------------------------------------------------------

    def _update_memory(self) -> None:
        mx, batch = self._mx, self._streams.batch
        self.memory = {
            "active": mx.get_active_memory(),
            "cache": mx.get_cache_memory(),
            "peak": mx.get_peak_memory(),
            "prompt_cache": batch.cache_bytes if batch is not None else 0,
            # Entries, hits (memory, disk), prompt tokens served from it, its files (prompt_store).
            **(batch.cache_figures() if batch is not None else {}),
            # What the store went on without (faults per kind) and the damaged entries it found.
            **store.figures(),
            # What one cached token costs (kv_cache: quantized or float16 when asked for).
            "kv_bytes_per_token": getattr(self.model, "kv_bytes_per_token", 0),
            "kv_bytes_per_token_float": getattr(self.model, "kv_bytes_per_token_float", 0),
            # The lane chosen at load (lane_choice.py): 1 when one request runs at a time.
            **lane_choice.lane_figures(self.model),
            # Across ranks, how the model is divided (parallel_tensor or parallel_pipeline: 1).
            **({f"parallel_{self.model.parallel}": 1} if getattr(self.model, "parallel", "") else {}),
            # An audio model's kind (audio_stt, audio_tts or audio_vad: 1), its rate, its jobs.
            **self._audio.figures(),
        }
        self.hooks.memory(self.memory)

    def _swap(self, model, config: Optional[EngineConfig]) -> None:
        """Drop the current model, its batch and caches; serve `model` (may be None)."""
        self._fail_all(failure("swapped"))
        self.model = self._streams.model = None
        gc.unfreeze()  # what the old model froze can be collected again
        gc.collect()
        self._mx.clear_cache()
        if config is not None:
            self.config = config
        self.model = model
        device_setup.check_model(model, self._device)
        self._streams.serve(model, self.config)
        # The model's objects live as long as it does: frozen, a full collection skips them and
        # walks only what requests create. Unfrozen, each walked ~460k objects (SmolLM2 with its
        # tokenizer), ~200 ms holding the GIL: a stall of every stream a few times a minute.
        gc.freeze()
        self._update_memory()
        self.hooks.swapped(model)

