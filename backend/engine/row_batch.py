"""Which queued inputs go into the next padded batch (pure Python, no MLX).

Embedding inputs and cross-encoder pairs are batched the same way: oldest
first, whichever call they came from, as many as fit the token budget once
padded to the longest; a call with many inputs may take several batches.
"""

from typing import Callable, Iterable, List


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
