"""A few requests run through one lane of a model not yet served: what each gave (any one thread).

LoadModel's check (lane_choice.py) runs short greedy requests, prepared the way a client's
are, through a lane exactly as the engine runs them: a scheduler's streams of their own
(streams.py: admission, the batch the factory opens for the lane, the text pipeline,
logprobs), passes driven here until every request has its last event. Speculation and the
disk tier are off, so the run leaves nothing behind. The first two requests arrive together
(a batch prefills them together); the rest arrive while those decode (they join a running
batch). Each probe decodes until the later ones have joined it: a batch prefills a prompt one
chunk per step between decode steps (the vision batch every prompt), so probes of a few tokens
could each end before the next, long prompt (an image's) joined, and the check would never see
rows decode together. Outcomes are read from the last events: each generated token with its
top-2 margin.
"""

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from typing import Callable, List, Optional

from engine.batch_factory import prefill_sizes
from engine.hooks import Hooks
from engine.requests import EngineError, failure
from engine.streams import Streams

log = logging.getLogger("mlx-backend.engine")

MAX_PASSES = 100_000  # a lane that never ends its requests is a bug: the check fails instead of hanging
TOGETHER = 3  # requests that arrive at once; the others join after the first pass


@dataclass
class Outcome:
    """What one probe request gave: its tokens with their log-probabilities and top-2 margins,
    and how it ended (`error` set when it failed)."""
    tokens: List[int] = field(default_factory=list)
    logprobs: List[float] = field(default_factory=list)
    margins: List[float] = field(default_factory=list)
    finish: Optional[str] = None
    error: Optional[str] = None


class _Quiet(Hooks):
    speculate = False  # the lane as it is, nothing wrapped around it
    disk_tier = False  # no file of a probe's cache outlives the check


class _Sink:
    """Where a probe request's events go: read here, never handed to an event loop."""


def run(lm, lane, config, requests: List, stream, beat: Callable[[], None] = lambda: None,
        together: int = TOGETHER, hooks: Optional[Hooks] = None) -> List[Outcome]:
    """Run `requests` (engine Requests for `lm`) through `lane` (a loaded.Lane), on this thread's
    `stream`; one Outcome per request, the first `together` arriving at once. `beat` is called
    each pass (Health's pulse, on the engine thread). `hooks`: what the batch goes through
    (across ranks, the group's journal: Hooks.probe), else _Quiet."""
    import mlx.core as mx

    # The lane as configured (how many run, how many prefill together), but the probes are the
    # check's own: no queue or KV budget bound of the model's options refuses them.
    config = dataclasses.replace(config, max_waiting=max(config.max_waiting, len(requests)), kv_budget_bytes=0)
    outbox: list = []
    streams = Streams(outbox, {"tokens_generated": 0, "prompt_tokens_processed": 0, "tokens_per_second": 0.0},
                      hooks or _Quiet())
    streams.mx, streams.stream = mx, stream
    streams.serve(dataclasses.replace(lm, lane=lane), config)  # the model as it would be served in that lane
    sinks = [_Sink() for _ in requests]
    for i, request in enumerate(requests):
        request.id = i + 1
    outlast_joins(lm, requests, prefill_sizes(config, mx).step_size)
    try:
        for request, sink in zip(requests[:together], sinks):
            streams.enqueue(request, sink)
        _pass(streams, beat)
        for request, sink in zip(requests[together:], sinks[together:]):  # while those decode
            streams.enqueue(request, sink)
        for _ in range(MAX_PASSES):
            if not streams.pending:
                break
            _pass(streams, beat)
        else:
            streams.fail_all(EngineError("INTERNAL", f"the lane did not finish within {MAX_PASSES} passes"))
    finally:
        streams.fail_all(failure("swapped"))  # closes the lane's batch (nothing is left in it by now)
    last = {}
    for sink, event in outbox:
        last[id(sink)] = event
    return [_outcome(last.get(id(s))) for s in sinks]


def outlast_joins(lm, requests: List, step_size: int) -> None:
    """Each request given as many more tokens as the steps the later ones take to prefill (one
    chunk a step at the slowest), within the context: all decode together before any ends."""
    extra = sum(-(-len(r.prompt) // step_size) for r in requests[1:])
    for r in requests:
        r.max_tokens = max(r.max_tokens, min(r.max_tokens + extra, lm.context_size - len(r.prompt)))


def _pass(streams: Streams, beat: Callable[[], None]) -> None:
    """One scheduler pass; a failure of the step as a whole fails what runs, as the engine does."""
    beat()
    try:
        streams.run(lambda: None, beat)
    except Exception as e:
        log.warning("load check: the lane's step failed: %s: %s", type(e).__name__, e)
        streams.fail_running(EngineError("INTERNAL", f"the step failed: {type(e).__name__}: {e}"))


def _outcome(event) -> Outcome:
    if event is None:
        return Outcome(error="no answer")
    if event.error is not None:
        return Outcome(error=f"{event.error.code}: {event.error}")
    entries = event.logprobs or []
    out = Outcome(finish=event.finish)
    for e in entries:
        top = e["top_logprobs"]
        out.tokens.append(e["id"])
        out.logprobs.append(e["logprob"])
        out.margins.append(top[0]["logprob"] - top[1]["logprob"] if len(top) > 1 else math.inf)
    return out
