"""What an audio job is, and what leaves the engine for it.

A job is built by preparation (prepare/audio.py) with everything its library call needs,
checked and bounded; the engine runs it (calls.py). Parts (a synthesised chunk) leave as
they are made; the job's end leaves once, as an AudioDone, or as an Event with its error
through Streams.end, like every request. Any thread builds a job; the engine thread owns it
from submission on.
"""

import time
from dataclasses import dataclass, field
from typing import Any, Dict


@dataclass(eq=False)
class AudioJob:
    task: str  # "transcribe", "speak" or "detect": which call of calls.py runs it
    args: Dict[str, Any]  # that call's inputs: a file path and options, a text, samples
    model_epoch: int
    label: str = ""  # for the log: the RPC and what it was asked
    id: int = 0
    t_arrived: float = field(default_factory=time.perf_counter)


@dataclass
class AudioPart:
    """One piece of a job's output, sent as soon as it is made (a chunk of speech)."""
    value: Any


@dataclass
class AudioDone:
    """A job's result (a transcript, the last of a synthesis, voice segments) and its timings."""
    value: Any
    queued_ms: float = 0.0
    run_ms: float = 0.0
