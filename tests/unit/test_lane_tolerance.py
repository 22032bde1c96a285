"""The lane check's tolerance (engine/lane_tolerance.py): the single stream's own noise, in
spacings of the model's float, decides where a comparison ends and how far a lane may stand."""

import math

import mlx.core as mx
from hypothesis import given
from hypothesis import strategies as st

from engine.lane_choice import differs
from engine.lane_probe import Outcome
from engine.lane_tolerance import FLOOR, MAX_UNITS, SLACK, Tolerance, measured

BF16 = 2.0 ** -7


def bf16_ulp(value: float) -> float:
    """The oracle: the distance to the next bfloat16 up, from its bits (not from a formula)."""
    x = mx.array([abs(value)], dtype=mx.float32).astype(mx.bfloat16)
    nxt = (x.view(mx.uint16) + 1).view(mx.bfloat16)
    return (nxt.astype(mx.float32) - x.astype(mx.float32)).item()


@given(st.sampled_from([0.3, 0.75, 1.0, 1.5, 2.0, 3.0, 7.9, 8.0, 20.0, 100.0]))
def test_the_spacing_is_bfloat16s_ulp(value):
    assert Tolerance(BF16).spacing(value) == bf16_ulp(value)


def run(logprobs, margins=None, tokens=None):
    n = len(logprobs)
    return Outcome(tokens=list(tokens or range(1, n + 1)), logprobs=list(logprobs),
                   margins=list(margins or [2.0] * n), finish="length")


STEPS = st.lists(st.floats(-12.0, -0.01), min_size=1, max_size=8)


@given(STEPS)
def test_two_runs_alike_measure_one_spacing(logprobs):
    ref = [run(logprobs)]
    assert measured(BF16, ref, [run(logprobs)]).units == 1


@given(STEPS, st.data())
def test_the_noise_measured_is_the_largest_move_and_passes_itself(logprobs, data):
    ref = run(logprobs)
    moves = data.draw(st.lists(st.integers(-20, 20), min_size=len(logprobs), max_size=len(logprobs)))
    base = Tolerance(BF16)
    again = run([lp + m * base.spacing(abs(lp) + 2.0) for lp, m in zip(logprobs, moves)])
    got = measured(BF16, [ref], [again])
    assert got.units == max(1, max(abs(m) for m in moves))
    assert differs([ref], [again], got) is None  # the single stream's own noise is within it
    # A lane further than SLACK times that noise, at a step well above FLOOR, differs.
    far = SLACK * got.units * base.spacing(abs(logprobs[0]) + 2.0) * 1.5
    if far > FLOOR and not got.tie(logprobs[0], 2.0):  # a near tie ends the comparison before it
        moved = run([logprobs[0] - far] + logprobs[1:])
        assert differs([ref], [moved], got) is not None


def test_past_a_near_tie_within_the_noise_nothing_is_compared():
    # margin 0.05 at -1.0: bfloat16's spacing at 1.05 is 2^-7; 2 x 4 spacings = 0.0625 > 0.05
    ref = run([-1.0, -0.5, -0.5], margins=[0.05, 2.0, 2.0])
    other = run([-3.0, -3.0, -3.0], tokens=[9, 9, 9])
    assert differs([ref], [other], Tolerance(BF16, units=4)) is None
    assert differs([ref], [other], Tolerance(BF16, units=2)) is not None  # 0.03125: not a tie
    assert differs([ref], [other]) is not None  # float32: a margin of 0.05 is no tie at all


def test_float32_keeps_the_floor():
    t = Tolerance(2.0 ** -23, units=MAX_UNITS)
    assert t.allowed(-2.0, 1.0) == FLOOR and not t.tie(-2.0, 2e-3)


def test_other_tokens_end_the_measure_and_it_is_capped():
    ref = run([-1.0, -1.0])
    parted = run([-1.0 + 3 * Tolerance(BF16).spacing(3.0), -9.0], tokens=[1, 7])  # the second step chose another token
    assert measured(BF16, [ref], [parted]).units == 3
    wild = run([-1.0 - 1000 * BF16, -1.0])
    assert measured(BF16, [ref], [wild]).units == MAX_UNITS
    assert measured(BF16, [ref], [Outcome(error="boom")]).units == 1
    assert not math.isnan(Tolerance(BF16).spacing(0.0))
