"""speculate.verify: the tokens it emits follow the model's distribution, whatever is proposed.

A toy "model" (a fixed table of next-token logits given the previous token)
stands in for the network, so the exact distribution of the first tokens is
known in closed form (numpy, written here) and both plain sampling and
speculative sampling are checked against it with a chi-square test over fixed
seeds: deterministic, no flake.
"""

import math

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from engine.lanes.sampling import SamplingParams, make_sampler
from engine.speculation.speculate import verify

V = 5
TABLE = np.random.default_rng(7).normal(0.0, 1.5, size=(V, V)).astype(np.float32)  # logits of next | prev
TEMPERATURE, TOP_K = 0.8, 4
STEPS = 2  # the joint of the first two tokens: 25 cells
RUNS = 2000


def exact_next(prev: int) -> np.ndarray:
    """p(next | prev) after top-k and temperature, in numpy."""
    logits = TABLE[prev].astype(np.float64)
    kept = np.argsort(-logits)[:TOP_K]
    out = np.full(V, -np.inf)
    out[kept] = logits[kept] / TEMPERATURE
    p = np.exp(out - out.max())
    return p / p.sum()


def exact_joint() -> np.ndarray:
    first = exact_next(0)
    return np.array([[first[a] * exact_next(a)[b] for b in range(V)] for a in range(V)])


def logprobs_after(prefix_last: list) -> mx.array:
    rows = mx.array(TABLE[prefix_last])
    return rows - mx.logsumexp(rows, axis=-1, keepdims=True)


def plain(seed: int) -> tuple:
    sampler = make_sampler(SamplingParams(temperature=TEMPERATURE, top_k=TOP_K, seed=seed), V)
    out, prev = [], 0
    for _ in range(STEPS):
        prev = int(sampler(logprobs_after([prev])).item())
        out.append(prev)
    return tuple(out)


def speculative(seed: int, propose) -> tuple:
    sampler = make_sampler(SamplingParams(temperature=TEMPERATURE, top_k=TOP_K, seed=seed), V)
    out = [0]
    while len(out) <= STEPS:
        drafts = propose(out)
        # Row i: the distribution after the context and drafts[:i].
        rows = logprobs_after([out[-1]] + drafts)
        out += verify(rows, drafts, sampler)
    return tuple(out[1:STEPS + 1])


def chi_square(samples, probs) -> tuple:
    counts = np.zeros_like(probs)
    for s in samples:
        counts[s] += 1
    assert counts[probs == 0].sum() == 0, "a token outside top-k was emitted"
    cells = probs > 0
    expected = probs[cells] * len(samples)
    stat = float(((counts[cells] - expected) ** 2 / expected).sum())
    df = int(cells.sum()) - 1
    # Wilson-Hilferty: the chi-square quantile at p = 0.001 (z = 3.09).
    critical = df * (1 - 2 / (9 * df) + 3.09 * math.sqrt(2 / (9 * df))) ** 3
    return stat, critical


PROPOSERS = {
    "likely": lambda ctx: [int(np.argmax(TABLE[ctx[-1]])), int(np.argmax(TABLE[int(np.argmax(TABLE[ctx[-1]]))]))],
    "unlikely": lambda ctx: [int(np.argmin(TABLE[ctx[-1]])), 0, 1],  # outside top-k at times: always rejected
    "cycle": lambda ctx: [(ctx[-1] + i) % V for i in range(1, 4)],
}


def test_plain_sampling_matches_the_exact_distribution():
    # The oracle itself: without this the test below could pass for the wrong reason.
    stat, critical = chi_square([plain(seed) for seed in range(RUNS)], exact_joint())
    assert stat < critical, (stat, critical)


@pytest.mark.parametrize("name", sorted(PROPOSERS))
def test_speculative_sampling_matches_the_exact_distribution(name):
    stat, critical = chi_square([speculative(seed, PROPOSERS[name]) for seed in range(RUNS)], exact_joint())
    assert stat < critical, (name, stat, critical)


@pytest.mark.parametrize("name", sorted(PROPOSERS))
def test_speculative_sampling_draws_what_plain_sampling_draws(name):
    # Keys depend on the position only: the same seed gives the same tokens.
    for seed in range(200):
        assert speculative(seed, PROPOSERS[name]) == plain(seed), seed


@settings(max_examples=200, deadline=None)
@given(st.integers(0, V - 1), st.lists(st.integers(0, V - 1), max_size=5))
def test_greedy_emits_the_argmax_path(prev, drafts):
    rows = logprobs_after([prev] + drafts)
    got = verify(rows, drafts, None)
    # The argmax path from `prev`, as far as the drafts agree with it, plus one.
    want, last = [], prev
    for d in drafts + [None]:
        best = int(np.argmax(TABLE[last]))
        want.append(best)
        if d != best:
            break
        last = d
    assert got == want
