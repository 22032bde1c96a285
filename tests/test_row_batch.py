"""take_rows: which queued inputs share the next padded batch, checked over random queues."""

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.row_batch import take_rows

lengths = st.lists(st.integers(1, 40), min_size=1, max_size=6)
pending = st.builds(lambda inputs, done, wanted: SimpleNamespace(
    job=SimpleNamespace(inputs=[[0] * n for n in inputs], wanted=wanted), done=min(done, len(inputs) - 1)),
    lengths, st.integers(0, 5), st.booleans())


def _reference(queue, budget):
    """The same choice, written as a walk over every waiting input in order."""
    waiting = [(p, i) for p in queue if p.job.wanted for i in range(p.done, len(p.job.inputs))]
    chosen, width = [], 0
    for p, i in waiting:
        w = max(width, len(p.job.inputs[i]))
        if chosen and (len(chosen) + 1) * w > budget:
            break
        chosen.append((p, i))
        width = w
    return chosen


@settings(max_examples=300, deadline=None)
@given(st.lists(pending, max_size=5), st.integers(1, 200))
def test_take_rows_is_the_oldest_inputs_that_fit(queue, budget):
    taken = take_rows(queue, budget, lambda p: p.job.wanted)
    rows = [(p, i) for p, a, b in taken for i in range(a, b)]
    assert [(id(p), i) for p, i in rows] == [(id(p), i) for p, i in _reference(queue, budget)]
    for p, a, b in taken:
        assert p.job.wanted and a == p.done and a < b <= len(p.job.inputs)
    if len(rows) > 1:  # padded to the longest, the batch fits the budget
        assert len(rows) * max(len(p.job.inputs[i]) for p, i in rows) <= budget
