"""Exact GELU from multiply-adds, for encoders served on MLX's CPU backend.

On the CPU, MLX evaluates erf one element at a time (about 25 ns each, one
thread), while a multiply or an add over the same array is vectorised and
~100 times cheaper. In a BERT-style encoder the erf inside GELU then takes
more time than every matmul together (all-MiniLM-L6-v2, 32 short sentences:
~60% of the pass). Here erf is a rational function of x (odd numerator of
degree 13 over an even denominator of degree 8, x clamped to [-4, 4], where
float32 erf is already ±1): only multiplies, adds and one divide, within
1e-6 of `mx.erf` everywhere. GPUs compute erf fast, so only the CPU swaps.
"""

import math
from functools import partial

import mlx.core as mx
import mlx.nn as nn

# Minimax coefficients for erf(x) = x * P(x^2) / Q(x^2) on [-4, 4] (as used by Eigen and XLA for float32).
_P = (-1.60960333262415e-02, -2.95459980854025e-03, -7.34990630326855e-04, -5.69250639462346e-05,
      -2.10102402082508e-06, 2.77068142495902e-08, -2.72614225801306e-10)
_Q = (-1.42647390514189e-02, -7.37332916720468e-03, -1.68282697438203e-03, -2.13374055278905e-04,
      -1.45660718464996e-05)


def _horner(coefficients, x2):
    """c0 + c1 x2 + c2 x2^2 + ... evaluated from the highest power down."""
    acc = coefficients[-1]
    for c in reversed(coefficients[:-1]):
        acc = acc * x2 + c
    return acc


def erf(x: mx.array) -> mx.array:
    x = mx.clip(x, -4.0, 4.0)
    x2 = x * x
    return x * _horner(_P, x2) / _horner(_Q, x2)


@partial(mx.compile, shapeless=True)
def gelu(x: mx.array) -> mx.array:
    """x * Phi(x), Phi the standard normal CDF: nn.gelu's function, erf computed as above
    (in float32: the small coefficients vanish in float16)."""
    x32 = x.astype(mx.float32)
    return (0.5 * x32 * (1.0 + erf(x32 * (1.0 / math.sqrt(2.0))))).astype(x.dtype)


class GELU(nn.Module):
    def __call__(self, x):
        return gelu(x)


def for_encoder(model: nn.Module, options) -> int:
    """swap_in unless the Option `fast_gelu:false` (load_options.Settings) keeps the library's GELU;
    how many were replaced."""
    return swap_in(model) if options.fast_gelu else 0


def swap_in(model: nn.Module) -> int:
    """Replace every exact (erf) nn.GELU module of `model` by this one when MLX runs on the CPU;
    how many were replaced. Approximate GELUs (tanh, sigmoid) are left as the model has them."""
    if mx.default_device() != mx.cpu:
        return 0
    swapped = 0
    for _, module in model.named_modules():
        for key, child in list(module.items()):
            if isinstance(child, nn.GELU) and getattr(child, "_approx", None) == "none":
                module[key] = GELU()
                swapped += 1
    return swapped
