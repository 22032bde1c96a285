"""What Health reads of the engine thread (any thread reads, the engine thread writes), and how
its loop paces itself when every pass fails."""

import logging
import sys
import time
from typing import Optional

log = logging.getLogger("mlx-backend.engine")

LOOP_BACKOFF_MAX_S = 0.5  # the longest pause between two passes of a loop that keeps failing


def backoff(failures: int) -> float:
    return min(0.001 * 2 ** (failures - 2), LOOP_BACKOFF_MAX_S)


class Pulse:
    """When the current pass (or call in it) began, whether the thread only waits for work, and
    since when every pass has failed."""

    def __init__(self):
        self.beat = time.monotonic()
        self.idle = False
        self.failing_since: Optional[float] = None
        self.failures = 0  # passes failed in a row

    def trouble(self, limit: float) -> Optional[str]:
        """Why the engine cannot serve though alive (failing every pass, or stuck in one pass,
        for longer than `limit` seconds), or None."""
        now = time.monotonic()
        since = self.failing_since
        if since is not None and now - since > limit:
            return f"every engine pass has failed for {now - since:.1f}s (bound: option health_timeout={limit:g}s)"
        idle, beat = self.idle, self.beat  # idle first: see Engine._drain_inbox
        if not idle and now - beat > limit:
            return (f"the engine has been inside one call for {now - beat:.1f}s "
                    f"(bound: option health_timeout={limit:g}s)")
        return None

    def passed(self) -> None:
        self.failures, self.failing_since = 0, None

    def failed(self) -> None:
        """A pass of the loop raised (in an except block): log it without flooding, then pause.

        A fault that recurs on every pass must neither flood the log nor spin a core:
        the first one is logged with its traceback, repeats at 2, 4, 8... in a row, and
        the loop pauses 1 ms, 2 ms, 4 ms... (at most LOOP_BACKOFF_MAX_S) before the next pass.
        """
        self.failures += 1
        self.failing_since = self.failing_since or self.beat
        n = self.failures
        if n == 1:
            log.exception("engine step failed; failing the running requests")
        elif n & (n - 1) == 0:
            log.error("engine step failed %d times in a row (%s); pausing %.0f ms between passes",
                      n, sys.exc_info()[1], backoff(n) * 1000)

    def pause(self) -> None:
        if self.failures > 1:
            time.sleep(backoff(self.failures))
