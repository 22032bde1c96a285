"""Samplers, logits processors, grammar masks (MLX on the CPU, no server)."""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from engine.lanes import grammar
from common.python_utils import OptionError
from engine.lanes.sampling import SamplingParams, make_processors, make_sampler


def logprobs_of(values):
    x = mx.array([values], dtype=mx.float32)
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


def draws(sampler, lp, n=30):
    return [sampler(lp).item() for _ in range(n)]


def test_greedy_has_no_sampler():
    assert make_sampler(SamplingParams(temperature=0.0), 10) is None


def test_seeded_sampler_reproducible_and_seed_dependent():
    lp = logprobs_of([0.0] * 50)
    a = draws(make_sampler(SamplingParams(temperature=1.0, seed=5), 50), lp)
    b = draws(make_sampler(SamplingParams(temperature=1.0, seed=5), 50), lp)
    c = draws(make_sampler(SamplingParams(temperature=1.0, seed=6), 50), lp)
    assert a == b and a != c


def test_seeded_sampler_ignores_the_global_random_state():
    lp = logprobs_of([0.0] * 50)
    mx.random.seed(1)
    a = draws(make_sampler(SamplingParams(temperature=1.0, seed=9), 50), lp)
    mx.random.seed(2)
    b = draws(make_sampler(SamplingParams(temperature=1.0, seed=9), 50), lp)
    assert a == b


def test_top_k_and_min_p_restrict_the_draws():
    lp = logprobs_of([5.0, 4.9, 4.8] + [0.0] * 47)
    assert set(draws(make_sampler(SamplingParams(temperature=1.0, top_k=2, seed=1), 50), lp, 60)) <= {0, 1}
    assert set(draws(make_sampler(SamplingParams(temperature=1.0, min_p=0.5, seed=1), 50), lp, 60)) <= {0, 1, 2}


def test_xtc_removes_the_top_choices():
    lp = logprobs_of([3.0, 2.9, 0.0, -5.0])
    s = make_sampler(SamplingParams(temperature=0.01, xtc_probability=1.0, xtc_threshold=0.1, seed=3), 4)
    # Tokens 0 and 1 are above the threshold: XTC keeps only the least likely of them.
    assert set(draws(s, lp)) == {1}


def test_logit_bias_and_penalties():
    logits = mx.zeros((1, 8))
    (bias,) = make_processors(SamplingParams(logit_bias={3: 5.0, 4: -5.0}))
    out = bias(mx.array([1, 2]), logits)
    assert out[0, 3].item() == 5.0 and out[0, 4].item() == -5.0 and out[0, 0].item() == 0.0
    assert make_processors(SamplingParams(repetition_penalty=1.0)) == []
    (rep,) = make_processors(SamplingParams(repetition_penalty=2.0))
    out = rep(mx.array([2]), mx.array([[1.0, 1.0, 4.0, -4.0]]))
    assert out.tolist() == [[1.0, 1.0, 2.0, -4.0]]
    (pres,) = make_processors(SamplingParams(presence_penalty=1.5))
    out = pres(mx.array([0, 0]), mx.zeros((1, 3)))
    assert out.tolist() == [[-1.5, 0.0, 0.0]]


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 200), st.integers(0, 2**32 - 1))
def test_bitmask_matches_llguidance_numpy_reference(vocab, seed):
    from llguidance.numpy import apply_token_bitmask_inplace

    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((1, vocab)).astype(np.float32)
    words = (vocab + 31) // 32
    bits = rng.integers(-2**31, 2**31, size=(1, words), dtype=np.int64).astype(np.int32)
    expected = logits.copy()
    apply_token_bitmask_inplace(expected, bits)
    ours = np.array(grammar.apply_bitmask(mx.array(logits), bits))
    np.testing.assert_array_equal(ours, expected)


def test_bitmask_shorter_than_logits_masks_the_rest():
    bits = np.array([[-1]], dtype=np.int32)  # 32 allowed ids
    out = np.array(grammar.apply_bitmask(mx.zeros((1, 40)), bits))
    assert np.isfinite(out[0, :32]).all() and np.isneginf(out[0, 32:]).all()


def test_grammar_sources_and_errors():
    assert grammar.grammar_source("", {}) is None
    assert grammar.grammar_source('root ::= ("yes" | "no")', {})
    assert grammar.grammar_source("", {"json_schema": '{"type": "object"}'})
    assert grammar.grammar_source("", {"response_format": '{"type": "json_object"}'})
    fmt = '{"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}}'
    assert grammar.grammar_source("", {"response_format": fmt})
    assert grammar.grammar_source("", {"response_format": '{"type": "text"}'}) is None
    with pytest.raises(OptionError, match="Grammar"):
        grammar.grammar_source("root ::= (", {})
    with pytest.raises(OptionError, match="json_schema"):
        grammar.grammar_source("", {"json_schema": "{oops"})
    assert grammar.grammar_source("", {"json_schema": '{"type": "object"}'})[1] == "Metadata.json_schema"
    with pytest.raises(OptionError, match="response_format"):
        grammar.grammar_source("", {"response_format": '{"type": "xml"}'})
