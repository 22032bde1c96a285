"""The engine: one thread owns the model and every MLX call.

Work enters as typed commands through a thread-safe inbox (Submit, Cancel,
Swap, Stop) and leaves as Events, handed to the event loop once per step for
all requests together. Running requests share one batch (text_batch: mlx-lm's
BatchGenerator and the prefix cache), each with its own sampler, logits
processors, token budget and text pipeline.

Every request gets exactly one terminal event (a finish or an error) on every
path: `_end` is the only place a request leaves the engine, and a failure is
confined to the request it belongs to whenever that request is known.
"""

import asyncio
import concurrent.futures
import contextlib
import gc
import itertools
import logging
import os
import queue
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Deque, Dict, List, Optional

from common.mlx_utils import Delta, OutputRouter, TextPipeline
from engine import kv_budget
from engine.forward import Cancelled, Forward, ForwardWork
from engine.sampling import RequestFailure, SamplingParams

log = logging.getLogger("mlx-backend.engine")


class EngineError(Exception):
    """A request failed; `code` is the gRPC status name the servicer sends."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass
class Request:
    prompt: List[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stops: List[str] = field(default_factory=list)
    model_epoch: int = 0
    id: int = 0
    label: str = ""  # the host's CorrelationId, for the log
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    processors: List[Any] = field(default_factory=list)  # extra logits processors (grammar)
    router: Optional[OutputRouter] = None  # content / reasoning / tool-call split
    n_draft: Optional[int] = None  # tokens speculated per step (None: the model's default, 0: none)
    fault: str = ""  # fault-injection site, tests only (MLX_BACKEND_FAULT_INJECTION=1)
    media: Any = None  # vision_prepare.VisionInputs of a request with images
    open_ended: bool = False  # max_tokens is "to the context's end", not asked: the KV budget may shorten it
    boundaries: List[int] = field(default_factory=list)  # prompt positions a later prompt likely shares (snapshots)


@dataclass
class Event:
    deltas: List[Delta] = field(default_factory=list)  # content / reasoning / tool-call pieces
    tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    prompt_ms: float = 0.0
    gen_ms: float = 0.0
    finish: Optional[str] = None  # "stop" | "length" | "cancelled"
    error: Optional[EngineError] = None
    logprobs: Optional[List[dict]] = None  # on the last event, when asked for


# ---- commands: the only things that enter the engine thread -------------------


@dataclass
class Submit:
    request: Request
    sink: "Sink"


@dataclass
class Cancel:
    request_id: int


@dataclass
class Swap:
    """Serve `model` (None: serve nothing) with `config`; the old model's requests end ABORTED."""
    model: Any
    config: Optional["EngineConfig"]
    done: concurrent.futures.Future


@dataclass
class Stop:
    pass


class Sink:
    """Where one request's events go: an asyncio queue on the caller's loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()


def _deliver(batch) -> None:
    for sink, event in batch:
        sink.queue.put_nowait(event)


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
LOOP_FAULT_PASSES = 12  # tests only: how many passes in a row Metadata fault "loop" fails
FAULT_SECONDS = 5.0  # tests only: how long Metadata fault "failing" fails every pass, and "stall" blocks one


def _backoff(failures: int) -> float:
    return min(0.001 * 2 ** (failures - 2), LOOP_BACKOFF_MAX_S)


class _InjectedDeath(BaseException):
    """Kills the engine thread: tests of a dead engine only."""


def _default_prompt_cache_bytes() -> int:
    """A tenth of the physical memory: room for many prefixes, far from the model's share."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 10
    except (ValueError, OSError, AttributeError):
        return 1 << 30


@dataclass
class EngineConfig:
    """How the engine serves a model: built from the load options (load_options), checked there."""
    max_sequences: int = 8
    prefill_step_size: int = 0  # 0: 128 on the CPU (~1.5 s a chunk here), 512 on a GPU
    prefill_batch_size: int = 8
    prompt_cache_bytes: int = field(default_factory=_default_prompt_cache_bytes)
    prompt_cache_entries: int = 64
    prompt_cache_disk_bytes: Optional[int] = None  # disk tier (disk_tier.py); None: 4 GiB or less by free space, 0: off
    forward_chunk_tokens: int = 0  # 0: a causal LM's prefill chunk, 1024 for an encoder
    max_waiting: int = 128  # requests queued beyond the batch's free places; more are refused
    kv_budget_bytes: Optional[int] = None  # KV bytes running requests may reserve; None: from memory, 0: no bound
    health_timeout: float = 60.0  # seconds failing, or inside one pass, before Health says not serving

    @classmethod
    def from_settings(cls, s) -> "EngineConfig":
        """From load_options.Settings; a row left unset (None) keeps the engine's default."""
        d = cls()
        return cls(
            max_sequences=s.max_sequences, prefill_step_size=s.prefill_step_size,
            prefill_batch_size=s.prefill_batch_size,
            prompt_cache_bytes=d.prompt_cache_bytes if s.prompt_cache_bytes is None else s.prompt_cache_bytes,
            prompt_cache_entries=s.prompt_cache_entries, prompt_cache_disk_bytes=s.prompt_cache_disk_bytes,
            forward_chunk_tokens=s.forward_chunk_tokens or 0,
            max_waiting=s.max_waiting, kv_budget_bytes=s.kv_budget_bytes, health_timeout=s.health_timeout)


@dataclass
class _Slot:
    request: Request
    sink: Sink
    pipeline: TextPipeline
    uid: int = -1  # in the batch generator, once admitted
    cached: int = 0
    tokens: int = 0
    kv_bytes: int = 0  # KV bytes reserved for it (kv_budget), counted while it runs
    t_arrived: float = 0.0
    t_admit: float = 0.0
    t_first: float = 0.0
    logprobs: List[dict] = field(default_factory=list)
    generated: List[int] = field(default_factory=list)  # token ids so far (speculation looks back at them)
    spec: Any = None  # speculate.Track, once it has decoded speculatively
    error: Optional[EngineError] = None  # set when this request alone failed
    done: bool = False  # its terminal event was sent

    def event(self, deltas=(), finish=None, error=None) -> Event:
        now = time.perf_counter()
        first = self.t_first or now
        return Event(
            deltas=list(deltas), tokens=self.tokens, prompt_tokens=len(self.request.prompt),
            cached_tokens=self.cached, prompt_ms=(first - self.t_admit) * 1000.0 if self.t_admit else 0.0,
            gen_ms=(now - first) * 1000.0 if self.t_first else 0.0,
            finish=finish, error=error,
            logprobs=self.logprobs[: self.pipeline.kept_tokens()] if finish and self.request.logprobs else None)


class Engine:
    def __init__(self, config: EngineConfig = None):
        self.config = config or EngineConfig()
        self.model = None  # model_loader.LoadedModel: read by any thread, swapped by the engine thread
        self.memory: Dict[str, int] = {}
        self.metrics = {"tokens_generated": 0, "prompt_tokens_processed": 0, "tokens_per_second": 0.0}
        self.dead: Optional[str] = None  # why the engine thread ended, once it has
        self.preparing = 0  # requests the servicer is preparing: about to arrive
        self.last_arrival = 0.0  # perf_counter when the servicer last began preparing one
        self._lock = threading.Lock()  # orders submissions against the engine's death
        self._inbox: "queue.SimpleQueue" = queue.SimpleQueue()
        self._ids = itertools.count(1)
        self._slots: Dict[int, _Slot] = {}  # running, by batch-generator uid
        self._waiting: Deque[_Slot] = deque()
        self._outbox: List[tuple] = []  # (sink, event) to hand over at the end of the step
        self._text = None  # text_batch.TextBatch of the current model, built on first use
        self._solo = None  # speculate.Solo: the lone request decoding speculatively, out of the batch
        self._forward = ForwardWork()  # embeddings and scores, run a chunk at a time between steps
        self._stopping = False
        self._kv_budget = 0  # KV bytes running requests may reserve (0: no bound); set at each swap
        self._loop_faults = 0  # tests only: passes of the loop still to fail (Metadata fault "loop")
        self._faulty_until = 0.0  # tests only: monotonic time until which every pass fails (fault "failing")
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
        """Run a forward job (forward.EmbedJob / ScoreJob); its result, or raises EngineError."""
        sink = Sink(asyncio.get_running_loop())
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
        """Take a request out at the next step (a no-op once it has finished)."""
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
                    if self._loop_faults or self._faulty_until > now:  # tests only: a fault on every pass
                        self._loop_faults = max(self._loop_faults - 1, 0)
                        raise RuntimeError("injected fault in the engine loop")
                    idle = not self.busy
                    if idle or now - last_mem > 0.5:  # fresh figures for Status, cheap
                        self._update_memory()
                        last_mem = now
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
        self._fail_running(EngineError("INTERNAL", "internal engine error (see the backend log)"))
        if failures > 1:
            time.sleep(_backoff(failures))

    def _close(self, cause: str) -> None:
        """No command is accepted any more; everything still inside gets its last event."""
        with self._lock:
            self.dead = cause
        error = EngineError("UNAVAILABLE", f"mlx: {cause}")
        for slot in list(self._slots.values()) + list(self._waiting):
            self._end(slot, Event(error=error))
        for sink, _ in self._forward.drop_all():
            self._outbox.append((sink, Event(error=error)))
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(command, (Submit, Forward)):
                self._outbox.append((command.sink, Event(error=error)))
            elif isinstance(command, Swap):
                command.done.set_exception(error)
        self._flush()
        if self.on_close is not None:
            try:
                self.on_close(cause)
            except Exception:
                log.exception("on_close failed")

    def _flush(self) -> None:
        """Hand this step's events to their loops: one wake-up per loop, not one per token."""
        if not self._outbox:
            return
        if not self.busy and getattr(self, "_mx", None) is not None:  # the last events: what Status reads is current first
            self._update_memory()
        batch, self._outbox = self._outbox, []
        by_loop: Dict[Any, list] = {}
        for sink, event in batch:
            by_loop.setdefault(sink.loop, []).append((sink, event))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the loop is gone (shutdown): nobody listens
                pass

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
            self._fail_all(EngineError("CANCELLED", "the backend is shutting down"))
            self._stopping = True
            self._keep_prompt_cache()

    def _keep_prompt_cache(self) -> None:
        """Let the prefix cache's disk writes finish, within the engine's stop time (backend.py
        joins this thread for ENGINE_STOP_S): the most recently used entries were queued first."""
        from engine import disk_tier

        if not disk_tier.drain_all(PROMPT_CACHE_DRAIN_S):
            log.warning("prompt cache: shutting down with disk writes still queued")

    # ---- a request's way through ----------------------------------------------

    def _emit(self, slot: _Slot, event: Event) -> None:
        self._outbox.append((slot.sink, event))

    def _end(self, slot: _Slot, event: Event) -> None:
        """The one place a request leaves the engine: its terminal event, exactly once."""
        if slot.done:
            return
        slot.done = True
        self._slots.pop(slot.uid, None)
        if self._solo is not None and self._solo.slot is slot:
            self._solo = None
        try:
            self._waiting.remove(slot)
        except ValueError:
            pass
        self._emit(slot, event)
        if event.error is not None:
            log.info("request %d%s failed: %s: %s", slot.request.id, _label(slot), event.error.code, event.error)
        else:
            log.info("request %d%s %s: prompt %d tokens (%d cached), completion %d tokens, "
                     "prefill %.0f ms, decode %.0f ms%s%s", slot.request.id, _label(slot), event.finish,
                     event.prompt_tokens, event.cached_tokens, event.tokens, event.prompt_ms, event.gen_ms,
                     f" ({event.tokens * 1000.0 / event.gen_ms:.1f} tok/s)" if event.gen_ms > 0 else "",
                     slot.spec.summary() if slot.spec is not None else "")

    def _fail(self, slot: _Slot, error: EngineError) -> None:
        """This request alone failed: out of the batch, then its error."""
        try:
            if slot.uid in self._slots and self._text is not None:
                self._take(slot, keep_cache=False)
        finally:  # if the batch cannot let go of it, the step's handler resets the batch
            self._end(slot, Event(error=error))

    def _finish(self, slot: _Slot, reason: str, deltas: List[Delta], cache=None, tokens=None) -> None:
        """A normal end; its KV cache is kept for later prompts when it is whole."""
        try:
            _inject(slot, "cache")
            self._text.save(tokens, cache)
        except Exception:  # the reply is complete: losing its cache entry must not fail it
            log.exception("request %d: keeping its prompt cache failed", slot.request.id)
        finally:
            self._end(slot, slot.event(deltas, finish=reason))

    def _enqueue(self, request: Request, sink: Sink) -> None:
        lm = self.model
        if lm is None:
            self._outbox.append((sink, Event(error=EngineError("FAILED_PRECONDITION", "mlx: model not loaded"))))
        elif request.model_epoch != lm.epoch:
            self._outbox.append((sink, Event(error=EngineError(
                "ABORTED", "the model was reloaded while the request was prepared"))))
        else:
            per_token = getattr(lm, "kv_bytes_per_token", 0) if self._kv_budget else 0
            if request.open_ended and per_token:
                # Reserving to the end of a long context would take the whole budget and run
                # requests one at a time: an open-ended one gets its share of the budget (or,
                # with a prompt longer than a share, the rest of the whole budget) and ends
                # "length" there, never past what was reserved.
                share = self._kv_budget // self.config.max_sequences // per_token - len(request.prompt)
                fits = share if share > 0 else self._kv_budget // per_token - len(request.prompt)
                if 0 < fits < request.max_tokens:
                    request.max_tokens = fits
            need = kv_budget.need(len(request.prompt), request.max_tokens, per_token)
            refused = self._refusal(request, need, per_token)
            if refused is not None:
                self._outbox.append((sink, Event(error=EngineError("RESOURCE_EXHAUSTED", refused))))
                log.info("request %d refused: %s", request.id, refused)
                return
            pipeline = TextPipeline(lm.detokenizer(), request.stops, request.router)
            self._waiting.append(_Slot(request=request, sink=sink, pipeline=pipeline,
                                       t_arrived=time.perf_counter(), kv_bytes=need))

    def _refusal(self, request: Request, need: int, per_token: int) -> Optional[str]:
        """Why a request cannot even wait (the queue is full, it could never fit), or None."""
        c = self.config
        places = max(c.max_sequences - len(self._slots), 0)  # those it fills are admitted this pass
        if len(self._waiting) >= places + c.max_waiting:
            return (f"{len(self._waiting)} requests are already waiting for a place in the batch "
                    f"(bound: option max_waiting={c.max_waiting}); retry later")
        if need > self._kv_budget > 0:
            return kv_budget.refusal(len(request.prompt), request.max_tokens, per_token, self._kv_budget)
        return None

    def _kv_fits(self, slot: _Slot) -> bool:
        """Whether its KV reservation fits next to the running requests' (always, with no budget)."""
        reserved = sum(s.kv_bytes for s in self._slots.values())
        return not self._kv_budget or reserved + slot.kv_bytes <= self._kv_budget

    def _enqueue_forward(self, command: Forward) -> None:
        lm = self.model
        if lm is None:
            self._outbox.append((command.sink, Event(error=EngineError("FAILED_PRECONDITION", "mlx: model not loaded"))))
        elif command.job.model_epoch != lm.epoch:
            self._outbox.append((command.sink, Event(error=EngineError(
                "ABORTED", "the model was reloaded while the request was prepared"))))
        else:
            self._forward.add(command.job, command.sink)

    def _forward_chunk(self) -> None:
        """One bounded chunk of embedding / score work (forward.py), between two decode steps."""
        lm = self.model
        # A causal LM's chunk is its prefill chunk; an encoder is small: more rows per pass.
        budget = self.config.forward_chunk_tokens or (
            self._batch().prefill_step_size if lm.kind == "text" else 1024)
        prefix = (lambda: self._batch().cache) if lm.kind == "text" else (lambda: None)
        try:
            done = self._forward.run_chunk(lm, budget, prefix, self._stream)
        except Exception as e:  # outside any one job (each job's own failure is returned): fail them all
            log.exception("forward work failed")
            done = [(sink, e) for sink, _ in self._forward.drop_all()]
        for sink, result in done:
            if isinstance(result, Cancelled):
                result = Event(error=EngineError("CANCELLED", "the caller went away"))
            elif isinstance(result, Exception):
                result = Event(error=EngineError("INTERNAL", f"forward pass failed: {type(result).__name__}: {result}"))
            self._outbox.append((sink, result))

    def _admit(self) -> None:
        if self._waiting and self._solo is not None:  # company: the lone stream goes back into the batch
            self._rejoin()
        while self._waiting and len(self._slots) < self.config.max_sequences:
            slot = self._waiting[0]  # stays in the queue, where a failure still finds it, until placed
            if not self._kv_fits(slot):  # it waits (in order) for running requests to end
                break
            req = slot.request
            slot.t_admit = time.perf_counter()
            # Alone, a short rest is prefilled at once and its first token sampled directly.
            direct = not self._slots and len(self._waiting) == 1
            try:
                _inject(slot, "admit")
                if req.fault == "engine":
                    raise _InjectedDeath("injected engine death")
                if req.fault == "loop":
                    self._loop_faults = LOOP_FAULT_PASSES
                if req.fault == "failing":
                    self._faulty_until = time.monotonic() + FAULT_SECONDS
                if req.fault == "stall":  # a call that does not return, as far as Health can tell
                    time.sleep(FAULT_SECONDS)
                uid, slot.cached, first = self._batch().admit(
                    req.prompt, req.max_tokens, req.sampling, req.processors, req.ignore_eos,
                    on_error=lambda e, slot=slot: self._sampling_failed(slot, e), direct=direct,
                    boundaries=req.boundaries,
                    **({"media": req.media} if req.media is not None else {}))
            except Exception as e:  # this request alone: the batch is as it was
                log.exception("request %d: admission failed", req.id)
                self._end(slot, Event(error=EngineError(
                    "INTERNAL", f"request setup failed: {type(e).__name__}: {e}")))
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
            from engine.text_batch import TextBatch

            if getattr(self.model, "kind", "text") == "vision":  # the same batch, with image prefill
                from engine.vision_batch import VisionBatch as TextBatch

            c, mx = self.config, self._mx
            self._text = TextBatch(
                self.model, max_sequences=c.max_sequences, prefill_batch_size=c.prefill_batch_size,
                # Measured on a 2-core CPU: 66-87 tok/s prefill whatever the chunk from 64 to
                # 512 tokens, so a small chunk costs little and bounds the stall of running streams.
                prefill_step_size=c.prefill_step_size or (128 if mx.default_device() == mx.cpu else 512),
                prompt_cache_bytes=c.prompt_cache_bytes, prompt_cache_entries=c.prompt_cache_entries,
                prompt_cache_disk_bytes=self._disk_bytes(), stream=self._stream)
        return self._text

    def _disk_bytes(self) -> int:
        """The prefix cache's disk budget (0: no disk tier)."""
        from engine import disk_tier

        budget = self.config.prompt_cache_disk_bytes
        return disk_tier.default_disk_bytes(disk_tier.folder_root()) if budget is None else budget

    @staticmethod
    def _sampling_failed(slot: _Slot, e: Exception) -> None:
        log.error("request %d: its sampler or logits processor failed", slot.request.id, exc_info=e)
        if slot.error is None:
            slot.error = EngineError("INTERNAL", str(e) if isinstance(e, RequestFailure)
                                     else f"request failed while sampling: {type(e).__name__}: {e}")

    def _step(self) -> None:
        started = time.perf_counter()
        if self._speculating():
            produced = self._solo_step()
        else:
            responses = self._text.step()
            for r in responses:
                slot = self._slots.get(r.uid)
                if slot is not None and not slot.done and slot.error is None:
                    self._token(slot, r)
            produced = len(responses)
        for slot in [s for s in self._slots.values() if s.error is not None]:
            self._fail(slot, slot.error)
        if produced:
            self.metrics["tokens_generated"] += produced
            rate = produced / max(time.perf_counter() - started, 1e-6)
            self.metrics["tokens_per_second"] = 0.8 * self.metrics["tokens_per_second"] + 0.2 * rate

    def _token(self, slot: _Slot, r) -> None:
        try:
            self._on_token(slot, r)
        except Exception as e:  # this request's text pipeline: it alone fails
            log.exception("request %d failed on token %d", slot.request.id, r.token)
            slot.error = slot.error or EngineError("INTERNAL", f"request failed: {type(e).__name__}: {e}")

    def _on_token(self, slot: _Slot, r) -> None:
        """One generated token of one request."""
        if not slot.t_first:
            slot.t_first = time.perf_counter()
        if r.finish_reason == "stop":  # an end-of-sequence token: not text
            self._finish(slot, "stop", slot.pipeline.finalize(), r.prompt_cache, r.all_tokens)
            return
        slot.tokens += 1
        slot.generated.append(r.token)
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
            self._emit(slot, slot.event(deltas))

    def _cancel(self, request_id: int) -> None:
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

    # ---- speculation: a lone stream decodes out of the batch (speculate.py) --------

    def _take(self, slot: _Slot, keep_cache: bool):
        """Take a running request out of the batch or of speculation: (its cache, tokens) or Nones."""
        if self._solo is not None and self._solo.slot is slot:
            solo, self._solo = self._solo, None
            return solo.release() if keep_cache else (None, None)
        return self._text.remove([slot.uid], keep_cache=keep_cache).get(slot.uid, (None, None))

    def _speculating(self) -> bool:
        """Whether this step decodes the one running request speculatively (leaving the batch if needed)."""
        if self._solo is not None:
            return True
        if len(self._slots) != 1 or self._waiting:
            return False
        from engine import speculate

        slot = next(iter(self._slots.values()))
        if not slot.t_first or (slot.spec is not None and not slot.spec.ready(len(slot.generated))):
            return False
        settings = speculate.settings_of(self.model)
        # A vision request's cache carries its image positions, and with a KV cache type a
        # verification pass (its chunk attends in float) would not be bit-exact: both stay in the batch.
        plain = self.model.kind == "text" and slot.request.media is None and self.model.kv is None
        n_draft = speculate.draft_length(settings, slot.request) if plain else 0
        if n_draft > 0 and not speculate.can_start(self._text.live_cache(slot.uid)):
            n_draft = 0  # its own cache cannot take drafts back (a recurrent state, a full window)
        if n_draft <= 0:
            slot.spec = speculate.Track.never()  # decided once for this request
            return False
        cache, _ = self._text.remove([slot.uid], keep_cache=True).get(slot.uid, (None, None))
        context = slot.request.prompt + slot.generated
        self._solo = speculate.Solo(self.model, settings, slot, cache, context,
                                    slot.request.max_tokens - len(slot.generated), n_draft, self._stream)
        return True

    def _solo_step(self) -> int:
        solo, slot, done = self._solo, self._solo.slot, 0
        try:
            for r in solo.step():
                done += 1
                self._token(slot, r)
                if slot.done or slot.error is not None:
                    break
        except Exception as e:  # this request alone: nothing else runs
            log.exception("request %d: speculative step failed", slot.request.id)
            slot.error = slot.error or EngineError("INTERNAL", f"request failed: {type(e).__name__}: {e}")
        if self._solo is solo and solo.wants_batch and slot.error is None:
            self._rejoin()
        return done

    def _rejoin(self) -> None:
        solo, self._solo = self._solo, None
        slot = solo.slot
        self._slots.pop(slot.uid, None)
        slot.uid = solo.rejoin(self._text.gen, lambda e, slot=slot: self._sampling_failed(slot, e))
        self._slots[slot.uid] = slot

    def _fail_running(self, error: EngineError) -> None:
        """The batch itself failed: its requests end with `error`, waiting ones start afresh."""
        for slot in list(self._slots.values()):
            self._end(slot, Event(error=error))
        self._reset_batch()

    def _fail_all(self, error: EngineError) -> None:
        for slot in list(self._waiting):
            self._end(slot, Event(error=error))
        for sink, _ in self._forward.drop_all():
            self._outbox.append((sink, Event(error=error)))
        self._fail_running(error)

    def _reset_batch(self) -> None:
        self._slots.clear()
        self._solo = None
        if self._text is not None:
            self._text.close()
        self._text = None

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

    def _swap(self, model, config: Optional[EngineConfig]) -> None:
        """Drop the current model, its batch and caches; serve `model` (may be None)."""
        self._fail_all(EngineError("ABORTED", "the model was unloaded or replaced"))
        self.model = None
        gc.unfreeze()  # what the old model froze can be collected again
        gc.collect()
        self._mx.clear_cache()
        if config is not None:
            self.config = config
        self.model = model
        budget = self.config.kv_budget_bytes
        self._kv_budget = kv_budget.default_budget(self._mx) if budget is None and model is not None else budget or 0
        if getattr(model, "kv_bytes_per_token", 0) and self._kv_budget:
            log.info("KV budget: %d bytes (%d tokens at %d bytes/token)", self._kv_budget,
                     self._kv_budget // model.kv_bytes_per_token, model.kv_bytes_per_token)
        # The model's objects live as long as it does: frozen, a full collection skips them and
        # walks only what requests create. Unfrozen, each walked ~460k objects (SmolLM2 with its
        # tokenizer), ~200 ms holding the GIL: a stall of every stream a few times a minute.
        gc.freeze()
        self._update_memory()


def _label(slot: _Slot) -> str:
    return f" ({slot.request.label})" if slot.request.label else ""


def _inject(slot: _Slot, site: str) -> None:
    if slot.request.fault == site:
        raise RuntimeError(f"injected fault at {site}")
