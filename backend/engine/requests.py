"""What enters and leaves the engine: requests, their events, commands, and the one map from a
failure to the error a caller sees.

A Request is built by preparation (prepare.py) and owned by the engine from submission on;
its Events go back to the caller's event loop through a Sink. Inside the engine each
request is a Slot: where it is, what it produced, how its last event is shaped.
"""

import asyncio
import concurrent.futures
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from common.mlx_utils import Delta, OutputRouter, TextPipeline
from engine.lanes.sampling import RequestFailure, SamplingParams


class EngineError(Exception):
    """A request failed; `code` is the gRPC status name the servicer sends."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass(eq=False)  # compared by identity: per-request side tables (faults.py) key on it
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
    """A stream's Request or a forward job, to the Work that accepts it (work.py)."""
    item: Any
    sink: "Sink"


@dataclass
class Cancel:
    """Take out a stream or a forward job, by its id."""
    request_id: int


@dataclass
class Swap:
    """Serve `model` (None: serve nothing) with `config`; the old model's requests end ABORTED."""
    model: Any
    config: Any  # config.EngineConfig, or None to keep the current one
    done: concurrent.futures.Future


@dataclass
class Trial:
    """Run `model` (not yet served) through `lane` with `requests` before it is swapped in
    (lane_choice.trial); `done` gets the lane that serves it, or the reason none does."""
    model: Any
    lane: Any  # loaders.loaded.Lane, as lane_choice.decide chose it
    config: Any
    requests: List[Any]
    fallback: bool  # a lane that fails may give way to the solo lane
    done: concurrent.futures.Future


@dataclass
class Decide:
    """Run the lane check (lane_choice.decide) for `model` on the engine thread, as a group of
    ranks needs (its probes run collectives in step with the served batch's); `done` gets the lane."""
    model: Any
    config: Any
    probes: Any  # () -> fresh probe requests
    forced: str  # the load option lane
    done: concurrent.futures.Future


@dataclass
class Stop:
    pass


@dataclass
class Lost:
    """Nothing the engine runs can go on (a lockstep group lost a rank): put by any thread;
    the engine thread raises `error` and ends."""
    error: BaseException


class Sink:
    """Where one request's events go: an asyncio queue on the caller's loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()


def deliver(batch) -> None:
    """On the caller's loop: hand each event to its sink."""
    for sink, event in batch:
        sink.queue.put_nowait(event)


def hand_over(items) -> None:
    """From the engine thread, each (sink, event) to its sink's loop: one wake-up per loop."""
    by_loop: Dict[Any, list] = {}
    for sink, event in items:
        by_loop.setdefault(sink.loop, []).append((sink, event))
    for loop, batch in by_loop.items():
        try:
            loop.call_soon_threadsafe(deliver, batch)
        except RuntimeError:  # the loop is gone (shutdown): nobody listens
            pass


@dataclass(eq=False)
class Slot:
    """One stream inside the engine, from its submission to its last event."""
    request: Request
    sink: Sink
    pipeline: TextPipeline
    uid: int = -1  # in the batch, once admitted
    cached: int = 0
    tokens: int = 0
    kv_bytes: int = 0  # KV bytes reserved for it (kv_budget), counted while it runs
    t_arrived: float = 0.0
    t_admit: float = 0.0
    t_first: float = 0.0
    logprobs: List[dict] = field(default_factory=list)
    note: str = ""  # what its batch adds to its last log line (speculation's drafts accepted)
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

    @property
    def label(self) -> str:
        return f" ({self.request.label})" if self.request.label else ""


# ---- failures: what each becomes for the caller (code, message) -----------------


# Failures whose message says it all, and those that add what was raised.
_FIXED = {
    "not loaded": ("FAILED_PRECONDITION", "mlx: model not loaded"),
    "reloaded": ("ABORTED", "the model was reloaded while the request was prepared"),
    "swapped": ("ABORTED", "the model was unloaded or replaced"),
    "shutdown": ("CANCELLED", "the backend is shutting down"),
    "cancelled": ("CANCELLED", "the caller went away"),
    "loop": ("INTERNAL", "internal engine error (see the backend log)"),
}
_RAISED = {  # an INTERNAL error: this prefix, then the exception (its pipeline, its speculative step: the rest)
    "admission": "request setup failed",
    "sampling": "request failed while sampling",
    "forward": "forward pass failed",
    "generation step": "the library's generation step failed",
}


def failure(where: str, e: BaseException = None) -> EngineError:
    """The EngineError a caller sees for a failure at `where`; every handler maps through here."""
    if where in _FIXED:
        return EngineError(*_FIXED[where])
    if where == "sampling" and isinstance(e, RequestFailure):  # a request's own processor said why
        return EngineError("INTERNAL", str(e))
    return EngineError("INTERNAL", f"{_RAISED.get(where, 'request failed')}: {type(e).__name__}: {e}")


def stopped(cause: str) -> EngineError:
    """For everything inside, and everything sent after, once the engine has ended."""
    return EngineError("UNAVAILABLE", f"mlx: {cause}")


def refused(why: str) -> EngineError:
    return EngineError("RESOURCE_EXHAUSTED", why)
