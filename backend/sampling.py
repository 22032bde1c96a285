"""Per-request samplers and logits processors (MLX; engine thread only)."""

from dataclasses import dataclass
from typing import List, Optional

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_logits_processors


@dataclass
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int = 0
    repetition_penalty: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def make_sampler(p: SamplingParams, vocab_size: int) -> Optional[callable]:
    """None for greedy (the batch then shares one argmax over all rows).

    mlx-lm's make_sampler draws from the process-wide random state, so one
    request's seed would depend on every other request; this one carries its
    own key, split at each step.
    """
    if p.greedy:
        return None
    filters = []
    if 0.0 < p.top_p < 1.0:
        filters.append(lambda x: apply_top_p(x, p.top_p))
    if p.min_p > 0.0:
        filters.append(lambda x: apply_min_p(x, p.min_p))
    if 0 < p.top_k < vocab_size:
        filters.append(lambda x: apply_top_k(x, p.top_k))
    key = mx.random.key(p.seed)
    inv_temp = 1.0 / p.temperature

    def sample(logprobs: mx.array) -> mx.array:
        nonlocal key
        key, sub = mx.random.split(key)
        for f in filters:
            logprobs = f(logprobs)
        return mx.random.categorical(logprobs * inv_temp, key=sub)

    return sample


def make_processors(p: SamplingParams) -> List[callable]:
    return make_logits_processors(
        repetition_penalty=p.repetition_penalty or None,
        presence_penalty=p.presence_penalty or None,
        frequency_penalty=p.frequency_penalty or None,
    )
