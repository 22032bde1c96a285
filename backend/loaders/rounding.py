"""How far float rounding alone moves a log-probability a loaded model computes (any thread).

Two computations of the same thing that the library calls equal (a batched step and a single
stream; a sequence in one pass and split in two) differ by rounding only: a logit in [32, 64)
(a confident step) rounds by up to 16 ulps of 1.0 in the model's float, and a reordered matmul
may round it again. More than that apart, they compute something else.
"""

FLOOR = 1e-3  # float32's rounding (measured ~2e-6 here) is far under it; a near tie ends a comparison at it
ULPS = 32  # of 1.0: float32 FLOOR, bfloat16 0.25, float16 0.03


def eps(model) -> float:
    """The machine epsilon of the coarsest float `model` holds (its compute type: quantized
    weights keep their scales in it); float32's for a model holding none."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    floats = {a.dtype for _, a in tree_flatten(model.parameters()) if mx.issubdtype(a.dtype, mx.floating)}
    return float(max((mx.finfo(d).eps for d in floats), default=mx.finfo(mx.float32).eps))


def allowed(model) -> float:
    """The rounding allowed for `model`: ULPS ulps of 1.0 in its coarsest float, never under FLOOR."""
    return max(FLOOR, ULPS * eps(model))
