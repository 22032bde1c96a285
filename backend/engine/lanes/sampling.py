"""Per-request samplers and logits processors (MLX; engine thread only)."""

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_logits_processors


class RequestFailure(Exception):
    """Raised by a request's own logits processor (its grammar): the message is for the client."""


@dataclass
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int = 0
    repetition_penalty: float = 0.0
    repetition_context_size: int = 20
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Dict[int, float] = field(default_factory=dict)
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    xtc_special_tokens: List[int] = field(default_factory=list)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def _xtc(logprobs: mx.array, probability: float, threshold: float, special: List[int], key) -> mx.array:
    # mlx-lm's apply_xtc draws from the process-wide random state; this draws from the request's key.
    probs = mx.softmax(logprobs, -1)
    above = mx.where(probs > threshold, probs, mx.inf).min(axis=-1, keepdims=True)
    mask = probs > above
    if special:
        mask[..., special] = False
    apply = mx.random.uniform(key=key) < probability
    return mx.where(apply, mx.where(mask, -mx.inf, logprobs), logprobs)


def make_sampler(p: SamplingParams, vocab_size: int, position: int = 0) -> Optional[Callable]:
    """None for greedy (the batch then shares one argmax over all rows).

    mlx-lm's make_sampler draws from the process-wide random state, so one
    request's seed would depend on every other request; this one draws the
    n-th token of a request with a key made from (seed, n), so the same seed
    gives the same text alone, in a batch, or with speculation (which draws
    several positions at once and then rewinds `position`).
    """
    if p.greedy:
        return None
    filters = []
    if 0.0 < p.top_p < 1.0:
        filters.append(lambda x, k: apply_top_p(x, p.top_p))
    if p.min_p > 0.0:
        filters.append(lambda x, k: apply_min_p(x, p.min_p))
    if p.xtc_probability > 0.0:
        filters.append(lambda x, k: _xtc(x, p.xtc_probability, p.xtc_threshold, p.xtc_special_tokens, k))
    if 0 < p.top_k < vocab_size:
        filters.append(lambda x, k: apply_top_k(x, p.top_k))
    return PositionSampler((p.seed & 0xFFFFFFFF) << 32, filters, 1.0 / p.temperature, position)


class PositionSampler:
    """Draws the token at `position` with its own key; each call moves on by one."""

    def __init__(self, base: int, filters: List[Callable], inv_temp: float, position: int = 0):
        self.base, self.filters, self.inv_temp, self.position = base, filters, inv_temp, position

    def __call__(self, logprobs: mx.array) -> mx.array:
        filter_key, draw_key = mx.random.split(mx.random.key(self.base | (self.position & 0xFFFFFFFF)))
        self.position += 1
        for f in self.filters:
            logprobs = f(logprobs, filter_key)
        return mx.random.categorical(logprobs * self.inv_temp, key=draw_key)


def make_processors(p: SamplingParams, extra: Optional[List[Callable]] = None) -> List[Callable]:
    """Penalties and logit bias from mlx-lm, then request-specific ones (grammar)."""
    rep = p.repetition_penalty if p.repetition_penalty and p.repetition_penalty != 1.0 else None
    procs = make_logits_processors(
        logit_bias=p.logit_bias or None,
        repetition_penalty=rep,
        repetition_context_size=p.repetition_context_size,
        presence_penalty=p.presence_penalty or None,
        frequency_penalty=p.frequency_penalty or None,
    )
    return procs + list(extra or [])



def argmax(logprobs):
    return logprobs.argmax(axis=-1)


def _unchanged(tokens, logits):
    return logits


def guarded(fn: Callable, fallback: Callable, on_error: Callable[[Exception], None]) -> Callable:
    """A request's own sampler or logits processor that fails that request alone.

    After the first error the lane keeps decoding that row with `fallback`
    until the engine takes the request out at the end of the step.
    """
    failed = False

    def call(*args):
        nonlocal failed
        if not failed:
            try:
                return fn(*args)
            except Exception as e:
                failed = True
                on_error(e)
        return fallback(*args)

    return call


def request_sampling(p: SamplingParams, extra: List[Callable], vocab_size: int,
                     on_error: Callable[[Exception], None]):
    """A request's own sampler (None: greedy) and logits processors, each failing it alone."""
    sampler = make_sampler(p, vocab_size)
    return (guarded(sampler, argmax, on_error) if sampler else None,
            [guarded(proc, _unchanged, on_error) for proc in make_processors(p, extra)])
