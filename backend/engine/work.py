"""The one interface the scheduler (core.py) drives every kind of work through.

Two kinds implement it: the streams of the served model (streams.py: generation in one
Batch) and forward jobs (forward_queue.py: embeddings, scores, rerank pairs). The scheduler
hands each submitted item to the first Work that accepts it, gives every Work one turn per
pass in order, and asks them all alike to cancel, to wait for a burst and to fail; it never
asks which kind it holds. Engine thread only.
"""

from typing import Callable, Optional, Protocol


class Work(Protocol):
    def accepts(self, item) -> bool:
        """Whether `item` (a Request, a forward job) is this Work's to run."""

    @property
    def pending(self) -> bool:
        """Whether anything waits or runs."""

    def first_arrival(self) -> Optional[float]:
        """perf_counter when its oldest waiting item arrived (the scheduler may hold it for a burst)."""

    def enqueue(self, item, sink) -> None:
        """Take `item`, or end it at once with its refusal (through Streams.end)."""

    def cancel(self, item_id: int) -> bool:
        """Take item `item_id` out at once or at its next turn; whether this Work held it."""

    def run(self, flush: Callable[[], None], beat: Callable[[], None]) -> None:
        """One bounded turn. `flush` hands the events so far over; `beat` tells Health a new call starts."""

    def fail_all(self, error, release: bool = True) -> None:
        """Everything it holds ends with `error`; with `release` it also lets go of what it holds
        for the model (the batch), False when the engine thread is ending."""
