"""Forward jobs (embeddings, scores, rerank pairs) as the scheduler sees them: one of its two
kinds of Work, driven the same way as the streams (streams.py). Engine thread only.

Jobs wait in ForwardWork's queue (forward/passes.py) and run one bounded chunk per pass, after the
streams' step; a job leaves through the same exit as a stream (Streams.end), with its result
or its error.
"""

import logging
from typing import Optional

from engine.forward.passes import Cancelled, ForwardWork, chunk_plan
from engine.requests import Event, failure

log = logging.getLogger("mlx-backend.engine")


class ForwardQueue:
    def __init__(self, streams, hooks):
        self.streams = streams  # the exit, the model and its batch (whose prefix cache a causal LM shares)
        self.hooks = hooks
        self.work = ForwardWork()
        self.mx_stream = None  # set by the engine thread

    def accepts(self, item) -> bool:
        return not self.streams.accepts(item)

    @property
    def pending(self) -> bool:
        return self.work.pending

    def first_arrival(self) -> Optional[float]:
        return self.work.first_arrival()

    def enqueue(self, job, sink) -> None:
        error = self.hooks.forward_refusal() or self.streams.refusal(job.model_epoch)
        if error is not None:
            self.streams.end(sink, Event(error=error))
        else:
            self.work.add(job, sink)

    def cancel(self, job_id: int) -> bool:
        return self.work.cancel(job_id)  # a job leaves at the next chunk

    def run(self, flush, beat) -> None:
        """One bounded chunk of embedding / score work (forward/passes.py), between two decode steps."""
        if not self.work.pending:
            return
        model, config = self.streams.model, self.streams.config
        budget, prefix = chunk_plan(model, config.forward_chunk_tokens, self.streams.open)
        try:
            done = self.work.run_chunk(model, budget, prefix, self.mx_stream)
        except Exception as e:  # outside any one job (each job's own failure is returned): fail them all
            log.exception("forward work failed")
            done = [(sink, e) for sink, _ in self.work.drop_all()]
        for sink, result in done:
            if isinstance(result, Cancelled):
                result = Event(error=failure("cancelled"))
            elif isinstance(result, Exception):
                result = Event(error=failure("forward", result))
            self.streams.end(sink, result)

    def fail_all(self, error, release: bool = True) -> None:
        for sink, _ in self.work.drop_all():
            self.streams.end(sink, Event(error=error))
