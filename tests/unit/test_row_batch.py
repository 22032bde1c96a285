"""take_rows and run_rows: which queued inputs share the next padded batch and how their
results reach their calls, checked over random queues."""

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.forward.row_batch import run_rows, take_rows

lengths = st.lists(st.integers(1, 40), min_size=1, max_size=6)
pending = st.builds(lambda inputs, done, wanted: SimpleNamespace(
    job=SimpleNamespace(inputs=[[0] * n for n in inputs], wanted=wanted), done=min(done, len(inputs) - 1)),
    lengths, st.integers(0, 5), st.booleans())


def _reference(queue, budget):
    """The rule stated as a search, not as take_rows' walk: of the waiting inputs in queue
    order, the longest leading run whose padded size (rows x the widest row) fits the budget,
    and the first input alone when none fits."""
    waiting = [(p, i) for p in queue if p.job.wanted for i in range(p.done, len(p.job.inputs))]

    def padded(run):
        return len(run) * max(len(p.job.inputs[i]) for p, i in run)

    fitting = [k for k in range(1, len(waiting) + 1) if padded(waiting[:k]) <= budget]
    return waiting[:max(fitting, default=min(1, len(waiting)))]


def _job(lengths, wanted=True, done=0):
    return SimpleNamespace(job=SimpleNamespace(inputs=[[0] * n for n in lengths], wanted=wanted), done=done)


def _place(queue, p):
    """p's place in the queue, by identity (two jobs alike compare equal)."""
    return next(n for n, q in enumerate(queue) if q is p)


# (each queued job's input lengths, wanted, done), budget -> the slices taken as (job, first, end).
# Worked by hand from the rule: oldest inputs first, padded to the widest, one input at least.
TAKE_TABLE = [
    ([([3, 5, 2], True, 0)], 15, [(0, 0, 3)]),            # 3, 2x5=10, 3x5=15: all fit
    ([([3, 5, 2], True, 0)], 14, [(0, 0, 2)]),            # the third would pad to 3x5=15
    ([([40], True, 0)], 1, [(0, 0, 1)]),                  # too wide alone: taken alone anyway
    ([([1, 1], False, 0), ([2, 2], True, 0)], 100, [(1, 0, 2)]),  # a job not wanted is passed over
    ([([9, 2, 2], True, 1)], 4, [(0, 1, 3)]),             # from the first input not yet done
    ([([4, 4], True, 0), ([1, 1, 1], True, 0)], 12, [(0, 0, 2), (1, 0, 1)]),  # 3 rows padded to 4
    ([([1], True, 0), ([10], True, 0)], 15, [(0, 0, 1)]),  # the wide one would make 2x10=20
    ([([1, 10], True, 0), ([1], True, 0)], 15, [(0, 0, 1)]),  # full: a later narrow input waits its turn
    ([([2], True, 0), ([2], False, 0), ([2], True, 0)], 4, [(0, 0, 1), (2, 0, 1)]),
    ([], 10, []),
    ([([5], False, 0)], 10, []),
]


@pytest.mark.parametrize("jobs, budget, expected", TAKE_TABLE)
def test_take_rows_by_hand(jobs, budget, expected):
    queue = [_job(lengths, wanted, done) for lengths, wanted, done in jobs]
    taken = take_rows(queue, budget, lambda p: p.job.wanted)
    assert [(_place(queue, p), a, b) for p, a, b in taken] == expected


@pytest.mark.parametrize("jobs, budget, expected", TAKE_TABLE)
def test_reference_by_hand(jobs, budget, expected):
    queue = [_job(lengths, wanted, done) for lengths, wanted, done in jobs]
    rows = [(_place(queue, p), i) for p, i in _reference(queue, budget)]
    assert rows == [(n, i) for n, a, b in expected for i in range(a, b)]


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
