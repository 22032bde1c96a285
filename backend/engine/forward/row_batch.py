"""Which queued inputs go into the next padded batch, and how its rows reach their jobs
(pure Python; the pass itself is the caller's).

Embedding inputs and cross-encoder pairs are batched the same way: oldest
first, whichever call they came from, as many as fit the token budget once
padded to the longest; a call with many inputs may take several batches.
"""

import logging
from typing import Any, Callable, Iterable, List

log = logging.getLogger("mlx-backend.forward")


def take_rows(queue: Iterable, budget: int, wanted: Callable) -> List[tuple]:
    """(pending, first, end) slices of the `wanted` jobs' inputs (`p.job.inputs` from `p.done`)
    that padded together fit `budget` tokens (one input at least)."""
    taken, rows, width = [], 0, 0
    for p in queue:
        if not wanted(p):
            continue
        inputs, end = p.job.inputs, p.done
        while end < len(inputs):
            w = max(width, len(inputs[end]))
            if rows and (rows + 1) * w > budget:
                break
            rows, width, end = rows + 1, w, end + 1
        if end > p.done:
            taken.append((p, p.done, end))
        if end < len(inputs):  # the budget is full
            break
    return taken


def run_rows(queue: List, taken: List[tuple], rows: Callable[[List[List[int]]], List[Any]],
             result: Callable[[Any], Any], what: str) -> List[tuple]:
    """One padded batch of the `taken` slices: `rows(inputs)` gives one value per input row.
    Each job collects its rows' values in `p.pooled`; a job whose last row is done leaves the
    queue and is answered with `result(p)`. Returns (sink, result) of those jobs; on a failure,
    (sink, exception) of every taken job, which all leave the queue (the others are untouched)."""
    try:
        values = rows([t for p, a, b in taken for t in p.job.inputs[a:b]])
        out, at = [], 0
        for p, a, b in taken:
            p.pooled = (p.pooled or []) + values[at:at + b - a]
            at += b - a
            p.done = b
            if b == len(p.job.inputs):
                queue.remove(p)
                out.append((p.sink, result(p)))
        return out
    except Exception as e:
        log.exception("%s of %d rows failed", what, sum(b - a for _, a, b in taken))
        for p, _, _ in taken:
            if p in queue:
                queue.remove(p)
        return [(p.sink, e) for p, _, _ in taken]
