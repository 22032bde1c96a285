"""take_rows and run_rows: which queued inputs share the next padded batch and how their
results reach their calls, checked over random queues."""

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.row_batch import run_rows, take_rows

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


calls = st.lists(st.tuples(st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=30), min_size=1, max_size=5),
                           st.booleans()), max_size=6)


@settings(max_examples=200, deadline=None)
@given(calls, st.integers(1, 120), st.integers(0, 8))
def test_run_rows_answers_every_call_once_with_its_own_rows(jobs, budget, failing_batch):
    """Batches run until no wanted input waits; batch number `failing_batch` raises. Every wanted
    call is answered exactly once: with one value per input, in its order, or with the error if
    one of its inputs was in the failing batch; calls not wanted stay queued, untouched."""
    queue = [SimpleNamespace(job=SimpleNamespace(inputs=inputs, wanted=wanted), done=0, pooled=None, sink=n)
             for n, (inputs, wanted) in enumerate(jobs)]
    unwanted = [p for p in queue if not p.job.wanted]
    answers, failed_rows, batch = {}, set(), 0
    error = RuntimeError("the pass failed")

    def rows(inputs):
        if batch == failing_batch:
            raise error
        return [tuple(t) for t in inputs]  # a value that names its input

    while any(p.job.wanted for p in queue):
        taken = take_rows(queue, budget, lambda p: p.job.wanted)
        if batch == failing_batch:
            failed_rows = {p.sink for p, _, _ in taken}
        for sink, result in run_rows(queue, taken, rows, lambda p: list(p.pooled), "a test batch"):
            assert sink not in answers, "a call answered twice"
            answers[sink] = result
        batch += 1
    assert queue == unwanted
    for n, (inputs, wanted) in enumerate(jobs):
        if not wanted:
            assert n not in answers
        elif n in failed_rows:
            assert answers[n] is error
        else:
            assert answers[n] == [tuple(t) for t in inputs]
