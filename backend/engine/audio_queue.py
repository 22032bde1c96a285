"""Audio jobs as the scheduler sees them: one of its kinds of Work, driven like the streams.

Jobs wait in arrival order; up to `max_sequences` of them run at once, each in its own turn
(turns.py) and resumed in turn for a slice of time per pass (TURN_S), so two transcriptions
started together both progress, a short one is not stuck behind a long one, a cancelled job
leaves at its next turn and Health sees each slice as a call. mlx-audio's generation runs
one input per call (no family batches a transcription with another), so taking turns is how
jobs share the model. Past `max_waiting` queued jobs a new one is refused at once
(RESOURCE_EXHAUSTED). A job leaves through Streams.end like every request, with its result or
its error. Engine thread only.
"""

import logging
import time
from collections import deque
from typing import Deque, List, Optional

from engine.audio import calls, turns
from engine.audio.jobs import AudioDone, AudioJob, AudioPart
from engine.requests import EngineError, Event, failure

log = logging.getLogger("mlx-backend.engine")

TURN_S = 0.05  # a job's slice of the engine thread per pass, before it hands back at an evaluation


class _Running:
    __slots__ = ("job", "sink", "turn", "started", "cancelled")

    def __init__(self, job: AudioJob, sink):
        self.job, self.sink, self.turn, self.started, self.cancelled = job, sink, None, 0.0, False


class AudioQueue:
    def __init__(self, streams):
        self.streams = streams  # the exit (Streams.end), the model, the config, the outbox
        self.waiting: Deque[_Running] = deque()
        self.running: List[_Running] = []
        self.mx_stream = None  # set by the engine thread
        self.done_jobs = 0

    @staticmethod
    def accepts(item) -> bool:
        return isinstance(item, AudioJob)

    @property
    def pending(self) -> bool:
        return bool(self.waiting or self.running)

    def first_arrival(self) -> Optional[float]:
        return None  # nothing is gained by holding a job for others: they take turns anyway

    def enqueue(self, job: AudioJob, sink) -> None:
        error = self.streams.refusal(job.model_epoch)
        config = self.streams.config
        if error is None and len(self.waiting) >= config.max_waiting:
            error = EngineError("RESOURCE_EXHAUSTED", f"{len(self.waiting)} audio jobs are already waiting "
                                f"(bound: option max_waiting={config.max_waiting}); retry later")
        if error is not None:
            self.streams.end(sink, Event(error=error))
            return
        self.waiting.append(_Running(job, sink))

    def cancel(self, job_id: int) -> bool:
        for entry in list(self.waiting):
            if entry.job.id == job_id:
                self.waiting.remove(entry)
                self.streams.end(entry.sink, Event(error=failure("cancelled")))
                return True
        for entry in self.running:
            if entry.job.id == job_id:
                entry.cancelled = True  # thrown in at its next turn
                return True
        return False

    def run(self, flush, beat) -> None:
        """Start what fits, then one slice of each running job, in turn."""
        if not self.pending:
            return
        turns.install()
        while self.waiting and len(self.running) < self.streams.config.max_sequences:
            entry = self.waiting.popleft()
            entry.started = time.perf_counter()
            entry.turn = turns.Turn(self._runner(entry))
            self.running.append(entry)
        for entry in list(self.running):
            beat()  # Health times each slice as a call
            self._slice(entry)
            flush()  # a chunk of speech leaves as soon as it is made

    def _runner(self, entry: _Running):
        model, stream, job = self.streams.model.model, self.mx_stream, entry.job

        def emit(value) -> None:
            self.streams.outbox.append((entry.sink, AudioPart(value)))

        def run():
            if job.task == "transcribe":
                return calls.transcribe(model, job.args, stream)
            if job.task == "speak":
                return calls.speak(model, job.args, emit)
            return calls.detect(model, job.args)
        return run

    def _slice(self, entry: _Running) -> None:
        if entry.cancelled:
            turns.cancel(entry.turn)
            self._end(entry, Event(error=failure("cancelled")))
            return
        try:
            finished, result = turns.resume(entry.turn, TURN_S)
        except Exception as e:  # the library failed for this input: this job alone
            log.warning("audio %s%s failed: %s: %s", entry.job.task, _tag(entry.job), type(e).__name__, e,
                        exc_info=True)
            self._end(entry, Event(error=_failure(entry.job, e)))
            return
        if finished:
            now = time.perf_counter()
            self._end(entry, AudioDone(result, queued_ms=(entry.started - entry.job.t_arrived) * 1000,
                                       run_ms=(now - entry.started) * 1000))

    def _end(self, entry: _Running, result) -> None:
        self.running.remove(entry)
        self.done_jobs += 1
        self.streams.end(entry.sink, result)

    def figures(self) -> dict:
        """For Status: the kind of the audio model served, its sample rate and its jobs."""
        lm = self.streams.model
        parts = getattr(lm, "audio", None)
        if parts is None:
            return {}
        return {f"audio_{parts.kind}": 1, "audio_sample_rate": parts.sample_rate, "audio_jobs_done": self.done_jobs,
                "audio_jobs_running": len(self.running), "audio_jobs_waiting": len(self.waiting)}

    def fail_all(self, error, release: bool = True) -> None:
        for entry in list(self.running):
            if release:
                turns.cancel(entry.turn)
            self._end(entry, Event(error=error))
        while self.waiting:
            self.streams.end(self.waiting.popleft().sink, Event(error=error))


def _tag(job: AudioJob) -> str:
    return f" ({job.label})" if job.label else ""


# The request's own choices a library may refuse by name (an unknown voice, language, speaker).
_CHOSEN = {"voice": "voice", "lang_code": "language", "language": "language", "gender": "params: gender"}


def _failure(job: AudioJob, e: Exception) -> EngineError:
    """What a caller sees when the library fails on its input, in the library's words: the
    request's fault (INVALID_ARGUMENT, naming its field) when the library names a value the
    request chose (Kitten's "Voice 'x' not available", Qwen3-TTS's "Speaker 'x' not
    supported"), else INTERNAL."""
    words = f"{type(e).__name__}: {e}"
    for key, field in _CHOSEN.items():
        value = job.args.get("options", {}).get(key)
        if isinstance(value, str) and value and isinstance(e, (ValueError, KeyError, LookupError, AssertionError,
                                                                FileNotFoundError)) and value in str(e):
            return EngineError("INVALID_ARGUMENT", f"{field}: {value!r} is refused by the model: {words}")
    return EngineError("INTERNAL", f"{job.task}: mlx-audio failed: {words}")
