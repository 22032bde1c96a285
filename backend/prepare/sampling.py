"""A request's sampling settings: its fields checked, the model's defaults filled in (prep thread)."""

import logging
import math
import os
from typing import Dict

from common.python_utils import OptionError, parse_json_field
from engine.lanes.sampling import SamplingParams

from .spec import RequestSpec, SamplingFields

log = logging.getLogger("mlx-backend.prepare")

# Fields a host may send that MLX samplers cannot express: logged once each.
UNSUPPORTED = {"TypicalP": 1.0, "TailFreeSamplingZ": 1.0, "Mirostat": 0, "NegativePrompt": ""}
_warned = set()

FLOAT_FIELDS = ("Temperature", "TopP", "MinP", "Penalty", "PresencePenalty", "FrequencyPenalty",
                "TypicalP", "TailFreeSamplingZ")


def _warn_unsupported(fields: SamplingFields) -> None:
    for name, neutral in UNSUPPORTED.items():
        value = fields.field(name)
        if value and value != neutral and name not in _warned:
            _warned.add(name)
            log.warning("%s=%r is not supported by the MLX samplers and is ignored", name, value)


def logit_bias(text: str, vocab: int) -> Dict[int, float]:
    """LogitBias: a JSON object of token id -> additive bias."""
    if not text.strip():
        return {}
    raw = parse_json_field("LogitBias", text, dict)
    bias = {}
    for key, value in raw.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise OptionError(f"LogitBias: key {key!r} is not a token id") from None
        if not 0 <= token < vocab:
            raise OptionError(f"LogitBias: token id {token} is outside the vocabulary [0, {vocab})")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise OptionError(f"LogitBias: bias for {token} must be a number")
        bias[token] = max(-100.0, min(100.0, float(value)))
    return bias


def _check(f: SamplingFields) -> None:
    for name in FLOAT_FIELDS:
        if not math.isfinite(f.field(name)):
            raise OptionError(f"{name}: must be a finite number")
    if f.temperature < 0:
        raise OptionError(f"Temperature: must be >= 0, got {f.temperature}")
    if not 0 <= f.top_p <= 1:
        raise OptionError(f"TopP: must be within [0, 1], got {f.top_p}")
    if f.top_k < 0:
        raise OptionError(f"TopK: must be >= 0, got {f.top_k}")
    if not 0 <= f.min_p <= 1:
        raise OptionError(f"MinP: must be within [0, 1], got {f.min_p}")
    if f.penalty < 0:
        raise OptionError(f"Penalty: must be >= 0, got {f.penalty}")
    for name in ("PresencePenalty", "FrequencyPenalty"):
        if not -2 <= f.field(name) <= 2:
            raise OptionError(f"{name}: must be within [-2, 2], got {f.field(name)}")


def sampling_params(spec: RequestSpec, vocab: int = 1 << 31) -> SamplingParams:
    """The request's values where set (non-zero), else the model's load options (their defaults)."""
    f, d = spec.sampling, spec.defaults
    _check(f)
    _warn_unsupported(f)
    seed = f.seed or d.seed
    return SamplingParams(
        temperature=f.temperature or d.temperature,
        top_p=f.top_p or d.top_p,
        top_k=f.top_k or d.top_k,
        min_p=f.min_p or d.min_p,
        seed=seed if seed else int.from_bytes(os.urandom(4), "little"),
        repetition_penalty=f.penalty or d.repetition_penalty,
        repetition_context_size=d.repetition_context_size,
        presence_penalty=f.presence_penalty or d.presence_penalty,
        frequency_penalty=f.frequency_penalty or d.frequency_penalty,
        logit_bias=logit_bias(f.logit_bias, vocab),
        xtc_probability=d.xtc_probability,
        xtc_threshold=d.xtc_threshold,
    )


def rebuildable(processor, *spec):
    """Tag a logits processor with how to build it again, for the other ranks of a group (lockstep)."""
    processor.remote = spec
    return processor
