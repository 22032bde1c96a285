"""What a variant of the engine changes, as one object the scheduler calls (engine thread).

The plain engine's hooks change nothing. Lockstep's (lockstep/leader.py) wrap the batch in
its journal, refuse forward work, turn off speculation and the disk tier, tell the
followers of swaps and flushes, add their memory figures and end the process when the
group is lost.
"""

from typing import Optional


class Hooks:
    speculate = True  # a lone stream may decode speculatively, out of the batch
    disk_tier = True  # the prefix cache may keep entries on disk

    def wrap(self, batch, config):
        """The batch the scheduler drives, built around the model's own."""
        return batch

    def probe(self, model) -> Optional["Hooks"]:
        """The hooks a lane check's runs of `model` (loaded, not yet served) go through (None:
        lane_probe.py's own, which change nothing but turn speculation and the disk tier off)."""
        return None

    def forward_refusal(self) -> Optional[Exception]:
        """Why forward work (Embedding, Score, Rerank) is not served at all, or None."""
        return None

    def flushed(self, batch) -> None:
        """After each hand-over of events (and each pass), with the current batch or None."""

    def memory(self, memory: dict) -> None:
        """Status figures just taken: add to them."""

    def swapped(self, model) -> None:
        """The engine serves `model` now (None: nothing)."""

    def stopped(self) -> None:
        """The engine is shutting down (after every request got its error)."""

    def close_cause(self, cause: str) -> str:
        """Why the engine ended, as it will be told to every caller."""
        return cause

    def closed(self) -> None:
        """The engine thread has ended and every request got its last event."""
