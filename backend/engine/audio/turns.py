"""Audio jobs take turns on the engine thread: each runs the library's own generation inside a
greenlet that hands control back at an evaluation once its turn is over.

mlx-audio's generation is one call per input (a file transcribed, a text spoken): left alone,
a long one would hold the engine thread for its whole length, with no turn for another job,
no way to cancel it, and Health seeing one endless call. Every family's loop evaluates what it
computes (`mx.eval` / `mx.async_eval` at each step or window): those calls are where a job
hands back. The hook is installed once on the engine thread's first audio job; it acts only
inside a job's greenlet (the engine's own code and other threads call the real functions as
they were) and costs one lookup per evaluation. A job that is cancelled gets the exception
thrown in at the point it handed back, so the library's own `finally` blocks run.
"""

import time
from typing import Any, Callable

import greenlet

_real = {}


class Cancelled(Exception):
    """Thrown into a job whose caller went away."""


class Turn(greenlet.greenlet):
    """One job's generation, resumed for a slice of time at a time, with MLX's global random
    key of its own: a family that seeds it (LingV3's `seed`) or samples from it draws as it
    would alone, whatever other jobs draw between its turns."""

    def __init__(self, run: Callable[[], Any]):
        super().__init__(run=run)
        self.deadline = 0.0
        self.key = None  # (its random key as a seed): None until its first turn ends


def _handing_back(real):
    def call(*args, **kwargs):
        out = real(*args, **kwargs)
        me = greenlet.getcurrent()
        if isinstance(me, Turn) and time.monotonic() >= me.deadline:
            me.parent.switch()
        return out
    call.__wrapped__ = real
    return call


def install() -> None:
    """Wrap mlx's evaluation calls (idempotent; engine thread)."""
    import mlx.core as mx

    if not _real:
        for name in ("eval", "async_eval"):
            _real[name] = getattr(mx, name)
            setattr(mx, name, _handing_back(_real[name]))


def resume(turn: Turn, slice_s: float):
    """Run `turn` for about `slice_s` seconds (to its next evaluation after that): (finished,
    its result). What the job raised is raised here."""
    import mlx.core as mx

    if turn.key is not None:
        mx.random.seed(turn.key)  # a key [hi, lo] is the seed (hi << 32) | lo
    turn.deadline = time.monotonic() + slice_s
    try:
        out = turn.switch()
    finally:
        hi, lo = (int(x) for x in mx.random.state[0].tolist())
        turn.key = (hi << 32) | lo
    return turn.dead, (out if turn.dead else None)


def cancel(turn: Turn) -> None:
    """End a started job: Cancelled raised where it handed back (what it raises is swallowed)."""
    if turn and not turn.dead:
        try:
            turn.throw(Cancelled())
        except Cancelled:
            pass
        except Exception:  # the library failed while unwinding: the job is over either way
            pass
