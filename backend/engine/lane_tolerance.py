"""How far a lane's log-probabilities may stand from the single stream's: the single stream's own
noise at the model's precision, measured at load (pure; any thread).

A log-probability comes out in the model's compute float (bfloat16 for a bf16 or quantized
model on a GPU): its spacing (an ulp) at a value x is eps * 2^floor(log2|x|), and two
computations the library calls equal (the single stream with its prompt prefilled whole, and in
pieces; a batched step) may land some spacings apart. The check at load (lane_choice.py) runs
the single stream twice, the second time with each prompt prefilled in pieces, and takes the
largest distance it sees, in spacings of each step (`units`, at least 1: the resolution itself).
Then for each step of the reference:

- a step whose top-2 margin is under K * units spacings of the larger of the two (each may move
  by the noise, the other way), or under MARGIN, is a near tie: past it either token is the
  library's and the comparison ends;
- a lane's log-probability more than SLACK * units spacings from the reference's, and more than
  FLOOR, computes something else (a batch reorders more sums than a prefill cut in pieces: it
  may move a value by some multiples of what the single stream's own runs show).

Float32 keeps FLOOR (its noise, ~1e-6 here, is far under it); a bf16 model's tolerance follows
what the model at hand does (a constant 0.25 let a log-probability drift by a quarter at any
magnitude, or failed a confident step that rounds coarser).
"""

import math
from dataclasses import dataclass
from typing import List, Sequence

FLOOR = 1e-3  # the least tolerance: float32's rounding (~2e-6 measured) is far under it
MARGIN = 1e-3  # the least near tie
K = 2  # the top two may each move by the noise, in opposite directions
SLACK = 4  # a batch's sums reordered more than a prefill cut in pieces
MAX_UNITS = 64  # more than this is not rounding: a single stream that computes otherwise when chunked


@dataclass(frozen=True)
class Tolerance:
    eps: float  # the machine epsilon of the model's compute float (loaders/rounding.py eps)
    units: int = 1  # the single stream's own noise, in spacings

    def spacing(self, value: float) -> float:
        """The compute float's spacing at `value` (its ulp there)."""
        return self.eps * 2.0 ** math.floor(math.log2(abs(value))) if value else self.eps

    def tie(self, logprob: float, margin: float) -> bool:
        """Whether a step that chose `logprob` with this top-2 margin is a near tie."""
        return margin < max(MARGIN, K * self.units * self.spacing(abs(logprob) + margin))

    def allowed(self, logprob: float, margin: float) -> float:
        """How far a lane's log-probability of this step may be from `logprob`."""
        return max(FLOOR, SLACK * self.units * self.spacing(abs(logprob) + margin))

    def __str__(self) -> str:
        return f"{self.units} spacing{'s' if self.units != 1 else ''} of eps {self.eps:.3g}"


def measured(eps: float, reference: Sequence, again: Sequence) -> Tolerance:
    """The tolerance from two single-stream runs of the same requests (Outcomes of lane_probe.py):
    the largest distance between their log-probabilities, in spacings of each step, up to the
    first near tie or other token of each request; capped at MAX_UNITS."""
    base = Tolerance(eps)
    units = 1
    for ref, out in zip(reference, again):
        if ref.error or out.error:
            continue
        for token, logprob, margin, got, got_logprob in zip(ref.tokens, ref.logprobs, ref.margins,
                                                            out.tokens, out.logprobs):
            if base.tie(logprob, margin) or got != token:
                break
            units = max(units, math.ceil(abs(got_logprob - logprob) / base.spacing(abs(logprob) + margin)))
    return Tolerance(eps, min(units, MAX_UNITS))


def steps_compared(reference: List, tolerance: Tolerance) -> int:
    """How many steps of the reference a comparison under `tolerance` looks at (for the log)."""
    n = 0
    for ref in reference:
        for logprob, margin in zip(ref.logprobs, ref.margins):
            if tolerance.tie(logprob, margin):
                break
            n += 1
    return n
