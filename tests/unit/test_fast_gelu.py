"""fast_gelu: GELU from multiply-adds against math.erf (the standard library) and MLX's own nn.gelu."""

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from hypothesis import given, settings, strategies as st

from loaders import fast_gelu


def exact_gelu(x: float) -> float:
    return 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))


def test_erf_over_a_dense_grid_matches_the_library():
    x = mx.linspace(-12.0, 12.0, 1_000_001)
    assert mx.max(mx.abs(fast_gelu.erf(x) - mx.erf(x))).item() < 1e-6
    assert mx.max(mx.abs(fast_gelu.gelu(x) - nn.gelu(x))).item() < 2e-6


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(-60.0, 60.0, width=32), min_size=1, max_size=64))
def test_gelu_matches_math_erf(values):
    ours = np.array(fast_gelu.gelu(mx.array(values, dtype=mx.float32)))
    for x, y in zip(values, ours):
        # float32 carries ~7 digits: an absolute bound near 0, a relative one for large |x|
        assert abs(y - exact_gelu(x)) <= 2e-6 * max(1.0, abs(x)), x


def test_float16_input_keeps_its_dtype():
    y = fast_gelu.gelu(mx.array([-3.0, -0.5, 0.0, 0.5, 3.0], dtype=mx.float16))
    assert y.dtype == mx.float16
    for x, v in zip([-3.0, -0.5, 0.0, 0.5, 3.0], y.tolist()):
        assert abs(v - exact_gelu(x)) < 2e-3


class _Block(nn.Module):
    def __init__(self, approx):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.act = nn.GELU(approx=approx)

    def __call__(self, x):
        return self.act(self.proj(x))


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = [_Block("none"), _Block("precise"), _Block("none")]
        self.head = nn.GELU()

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def test_swap_in_replaces_exact_gelu_modules_only_and_keeps_the_output():
    mx.random.seed(3)
    net = _Net()
    x = mx.random.normal((4, 8)) * 3
    before = net(x)
    assert fast_gelu.swap_in(net) == 3  # two layers' and the head's; the tanh one stays
    assert isinstance(net.layers[1].act, nn.GELU) and net.layers[1].act._approx == "precise"
    assert all(isinstance(m, fast_gelu.GELU) for m in (net.layers[0].act, net.layers[2].act, net.head))
    assert mx.max(mx.abs(net(x) - before)).item() < 1e-5
