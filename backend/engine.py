"""The engine: one thread owns the model and every MLX call.

Requests enter through a thread-safe inbox and come back as an async stream of
Events. Every active request sits in one mlx-lm BatchGenerator (continuous
batching: a request joins at the next step and leaves when done), each with
its own sampler, logits processors, token budget and text pipeline. Finished
and cancelled requests leave their KV cache in mlx-lm's LRUPromptCache (a trie
over token ids, bounded by bytes) for the next request sharing the prefix.
"""

import asyncio
import concurrent.futures
import gc
import itertools
import logging
import os
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Deque, Dict, List, Optional

from common.mlx_utils import Delta, OutputRouter, TextPipeline
from logprobs import entry
from sampling import SamplingParams

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


def _default_prompt_cache_bytes() -> int:
    """A tenth of the physical memory: room for many prefixes, far from the model's share."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 10
    except (ValueError, OSError, AttributeError):
        return 1 << 30


@dataclass
class EngineConfig:
    max_sequences: int = 8
    prefill_step_size: int = 0  # 0: 128 on the CPU (~1.5 s a chunk here), 512 on a GPU
    prefill_batch_size: int = 8
    prompt_cache_bytes: int = field(default_factory=_default_prompt_cache_bytes)
    prompt_cache_entries: int = 64


@dataclass
class _Slot:
    request: Request
    sink: Callable[[Event], None]
    pipeline: TextPipeline
    uid: int = -1
    cached: int = 0
    tokens: int = 0
    t_admit: float = 0.0
    t_first: float = 0.0
    logprobs: List[dict] = field(default_factory=list)
    error: Optional[EngineError] = None  # set when this request alone failed

    def event(self, deltas=(), finish=None, error=None) -> Event:
        now = time.perf_counter()
        first = self.t_first or now
        return Event(
            deltas=list(deltas), tokens=self.tokens, prompt_tokens=len(self.request.prompt),
            cached_tokens=self.cached, prompt_ms=(first - self.t_admit) * 1000.0 if self.t_admit else 0.0,
            gen_ms=(now - first) * 1000.0 if self.t_first else 0.0,
            finish=finish, error=error,
            logprobs=self.logprobs[: self.pipeline.kept_tokens()] if finish and self.request.logprobs else None)


def _argmax(logprobs):
    return logprobs.argmax(axis=-1)


def _unchanged(tokens, logits):
    return logits


def _guarded(slot: _Slot, fn: Callable, fallback: Callable) -> Callable:
    """A request's own sampler or logits processor, failing that request alone.

    The batch keeps decoding with the fallback for this row until the engine
    removes the request at the end of the step.
    """
    def call(*args):
        if slot.error is None:
            try:
                return fn(*args)
            except Exception as e:
                log.exception("request %d: its sampler or logits processor failed", slot.request.id)
                slot.error = EngineError("INTERNAL", f"request failed while sampling: {type(e).__name__}: {e}")
        return fallback(*args)
    return call


class Engine:
    def __init__(self, config: EngineConfig = None):
        self.config = config or EngineConfig()
        self.model = None  # model_loader.LoadedModel, set and cleared in the engine thread
        self.epoch = 0
        self.memory: Dict[str, int] = {}
        self.metrics = {"tokens_generated": 0, "prompt_tokens_processed": 0, "tokens_per_second": 0.0}
        self._inbox: "queue.SimpleQueue" = queue.SimpleQueue()
        self._ids = itertools.count(1)
        self._slots: Dict[int, _Slot] = {}  # by BatchGenerator uid
        self._waiting: Deque[_Slot] = deque()
        self._gen = None
        self._prompt_cache = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="mlx-engine", daemon=True)
        self._thread.start()

    # ---- called from any thread -------------------------------------------

    @property
    def busy(self) -> bool:
        return bool(self._slots or self._waiting)

    def call(self, fn: Callable, *args) -> concurrent.futures.Future:
        """Run fn(engine, *args) in the engine thread (load, free, ...)."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put(("call", fn, args, fut))
        return fut

    async def stream(self, request: Request) -> AsyncIterator[Event]:
        """Submit a request; yields its Events until the last one (finish set)."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        request.id = next(self._ids)

        def sink(ev: Event) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, ev)
            except RuntimeError:  # the loop is gone (shutdown): nobody listens
                pass

        self._inbox.put(("submit", request, sink))
        done = False
        try:
            while not done:
                ev = await events.get()
                done = ev.finish is not None or ev.error is not None
                if ev.error is not None:
                    raise ev.error
                yield ev
        finally:
            if not done:  # the client left: free the slot at the next step
                self.cancel(request.id)

    def cancel(self, request_id: int) -> None:
        """Take a request out at the next step (a no-op once it has finished)."""
        self._inbox.put(("cancel", request_id))

    def stop(self) -> None:
        self._inbox.put(("stop",))
        self._thread.join(timeout=10)

    # ---- engine thread ----------------------------------------------------

    def _run(self) -> None:
        import mlx.core as mx

        self._mx = mx
        self._stream = mx.default_stream(mx.default_device())
        last_mem = 0.0
        while not self._stopping:
            try:
                now = time.monotonic()
                idle = not self.busy
                if idle or now - last_mem > 0.5:  # fresh figures for Status, cheap
                    self._update_memory()
                    last_mem = now
                self._drain_inbox(block=idle)
                self._admit()
                if self._slots:
                    self._step()
            except Exception:  # a bug: fail what is in flight, keep serving
                log.exception("engine step failed; failing the requests in flight")
                self._fail_all(EngineError("INTERNAL", "internal engine error (see the backend log)"))
                self._reset_generator()

    def _drain_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=None) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, item) -> None:
        kind = item[0]
        if kind == "submit":
            _, request, sink = item
            self._enqueue(request, sink)
        elif kind == "cancel":
            self._cancel(item[1])
        elif kind == "call":
            _, fn, args, fut = item
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(self, *args))
                except BaseException as e:  # delivered to the caller
                    fut.set_exception(e)
        elif kind == "stop":
            self._fail_all(EngineError("CANCELLED", "the backend is shutting down"))
            self._stopping = True

    def _enqueue(self, request: Request, sink) -> None:
        lm = self.model
        if lm is None:
            sink(Event(error=EngineError("FAILED_PRECONDITION", "mlx: model not loaded")))
            return
        if request.model_epoch != self.epoch:
            sink(Event(error=EngineError("ABORTED", "the model was reloaded while the request was prepared")))
            return
        pipeline = TextPipeline(lm.tokenizer.detokenizer, request.stops, request.router)
        self._waiting.append(_Slot(request=request, sink=sink, pipeline=pipeline))

    def _admit(self) -> None:
        from mlx_lm.generate import BatchGenerator, StopSequences
        from mlx_lm.models.cache import LRUPromptCache, can_trim_prompt_cache, trim_prompt_cache

        from sampling import make_processors, make_sampler

        while self._waiting and len(self._slots) < self.config.max_sequences:
            slot = self._waiting.popleft()
            lm, req = self.model, slot.request
            if self._gen is None:
                self._gen = BatchGenerator(
                    lm.model, completion_batch_size=self.config.max_sequences,
                    prefill_batch_size=self.config.prefill_batch_size,
                    prefill_step_size=self._prefill_step(), stream=self._stream)
                self._prompt_cache = LRUPromptCache(
                    max_size=self.config.prompt_cache_entries, max_bytes=self.config.prompt_cache_bytes)
                self._eos = StopSequences([(t,) for t in lm.tokenizer.eos_token_ids])
                self._no_stop = StopSequences([])
            cache, rest = self._prompt_cache.fetch_nearest_cache(self.epoch, req.prompt)
            if cache is not None and not rest:
                # The whole prompt is cached: recompute its last token for the logits.
                if can_trim_prompt_cache(cache):
                    trim_prompt_cache(cache, 1)
                    rest = req.prompt[-1:]
                else:
                    cache, rest = None, req.prompt
            slot.cached = len(req.prompt) - len(rest)
            slot.t_admit = time.perf_counter()
            try:
                sampler = make_sampler(req.sampling, len(lm.tokenizer))
                processors = make_processors(req.sampling, req.processors)
            except Exception as e:
                log.exception("request %d: building its sampler failed", req.id)
                slot.sink(Event(error=EngineError("INTERNAL", f"request setup failed: {type(e).__name__}: {e}")))
                continue
            (slot.uid,) = self._gen.insert(
                [rest], max_tokens=[req.max_tokens], caches=[cache],
                all_tokens=[req.prompt[: slot.cached]],
                samplers=[_guarded(slot, sampler, _argmax) if sampler else None],
                logits_processors=[[_guarded(slot, p, _unchanged) for p in processors]],
                stop_sequences=[self._no_stop if req.ignore_eos else self._eos])
            self._slots[slot.uid] = slot
            self.metrics["prompt_tokens_processed"] += len(rest)
            log.debug("request %d admitted: %d prompt tokens, %d cached", req.id, len(req.prompt), slot.cached)

    def _prefill_step(self) -> int:
        """Prompt tokens per prefill chunk: running streams wait at most one chunk.

        Measured on a 2-core CPU: 66-87 tok/s prefill whatever the chunk from
        64 to 512 tokens, so a small chunk costs little and bounds the stall.
        """
        mx = self._mx
        return self.config.prefill_step_size or (128 if mx.default_device() == mx.cpu else 512)

    def _step(self) -> None:
        started = time.perf_counter()
        _, responses = self._gen.next()
        stopped, failed = [], []
        for r in responses:
            slot = self._slots.get(r.uid)
            if slot is None:
                continue
            if slot.error is None:
                try:
                    if self._on_token(slot, r):
                        stopped.append(slot)
                except Exception as e:  # this request's text pipeline: it alone fails
                    log.exception("request %d failed on token %d", slot.request.id, r.token)
                    slot.error = EngineError("INTERNAL", f"request failed: {type(e).__name__}: {e}")
            if slot.error is not None and slot.uid in self._slots:
                failed.append(slot)
        for slot in list(self._slots.values()):  # failures inside a sampler or processor
            if slot.error is not None and slot not in failed:
                failed.append(slot)
        if failed:
            self._gen.remove([s.uid for s in failed])
            for slot in failed:
                self._slots.pop(slot.uid, None)
                slot.sink(Event(error=slot.error))
        if stopped:
            caches = self._gen.remove([s.uid for s in stopped], return_prompt_caches=True)
            for slot in stopped:
                cache, tokens = caches.get(slot.uid, (None, None))
                self._finish(slot, "stop", slot.pipeline.finalize(), cache, tokens)
        if responses:
            self.metrics["tokens_generated"] += len(responses)
            rate = len(responses) / max(time.perf_counter() - started, 1e-6)
            self.metrics["tokens_per_second"] = 0.8 * self.metrics["tokens_per_second"] + 0.2 * rate

    def _on_token(self, slot: _Slot, r) -> bool:
        """One generated token of one request; True when a stop string ended it."""
        if not slot.t_first:
            slot.t_first = time.perf_counter()
        if r.finish_reason == "stop":  # an end-of-sequence token: not text
            self._finish(slot, "stop", slot.pipeline.finalize(), r.prompt_cache, r.all_tokens)
            return False
        slot.tokens += 1
        if slot.request.logprobs:
            slot.logprobs.append(entry(self.model.tokenizer, r.token, r.logprobs, slot.request.top_logprobs))
        deltas = slot.pipeline.add_token(r.token)
        if slot.pipeline.stopped:
            if deltas:
                slot.sink(slot.event(deltas))
            return True
        if r.finish_reason == "length":
            self._finish(slot, "length", deltas + slot.pipeline.finalize(), r.prompt_cache, r.all_tokens)
        elif deltas:
            slot.sink(slot.event(deltas))
        return False

    def _finish(self, slot: _Slot, reason: str, deltas, cache=None, tokens=None) -> None:
        self._slots.pop(slot.uid, None)
        if cache is not None and tokens:
            self._prompt_cache.insert_cache(self.epoch, list(tokens), cache)
        ev = slot.event(deltas, finish=reason)
        slot.sink(ev)
        log.info("request %d%s %s: prompt %d tokens (%d cached), completion %d tokens, "
                 "prefill %.0f ms, decode %.0f ms%s", slot.request.id,
                 f" ({slot.request.label})" if slot.request.label else "", reason, ev.prompt_tokens,
                 ev.cached_tokens, ev.tokens, ev.prompt_ms, ev.gen_ms,
                 f" ({ev.tokens * 1000.0 / ev.gen_ms:.1f} tok/s)" if ev.gen_ms > 0 else "")

    def _cancel(self, request_id: int) -> None:
        for slot in list(self._waiting):
            if slot.request.id == request_id:
                self._waiting.remove(slot)
                slot.sink(slot.event(finish="cancelled"))
                return
        for slot in list(self._slots.values()):
            if slot.request.id == request_id:
                # Only a request that reached decoding has a cache known to be whole
                # (a prompt batch mid-prefill may still hold padding).
                keep = bool(slot.t_first)
                caches = self._gen.remove([slot.uid], return_prompt_caches=keep)
                cache, tokens = caches.get(slot.uid, (None, None))
                self._finish(slot, "cancelled", [], cache, tokens)
                return

    def _fail_all(self, error: EngineError) -> None:
        for slot in list(self._slots.values()) + list(self._waiting):
            slot.sink(Event(error=error))
        self._slots.clear()
        self._waiting.clear()

    def _reset_generator(self) -> None:
        if self._gen is not None:
            try:
                self._gen.close()
            except Exception:
                log.exception("closing the batch generator failed")
        self._gen = None
        self._prompt_cache = None

    def _update_memory(self) -> None:
        mx = self._mx
        self.memory = {
            "active": mx.get_active_memory(),
            "cache": mx.get_cache_memory(),
            "peak": mx.get_peak_memory(),
            "prompt_cache": self._prompt_cache.nbytes if self._prompt_cache is not None else 0,
        }

    # ---- model lifecycle (run through call()) -----------------------------

    def replace_model(self, loaded) -> None:
        """Drop the current model, its batch and caches; serve `loaded` (may be None)."""
        self._fail_all(EngineError("ABORTED", "the model was unloaded or replaced"))
        self._reset_generator()
        self.model = None
        gc.collect()
        self._mx.clear_cache()
        self.model = loaded
        self.epoch += 1
        self._update_memory()
