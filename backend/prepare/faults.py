"""Faults a test asks for in Metadata (only with MLX_BACKEND_FAULT_INJECTION=1): the engine fails
where it is told, for the fault-isolation tests. Kept out of the product path's functions."""

import os
from typing import List, Mapping, Tuple

from common.python_utils import OptionError
from engine.sampling import injected_fault

from .sampling import rebuildable

FAULT_SITES = ("admit", "cache", "engine", "loop", "failing", "stall")  # where Metadata `fault` makes the engine fail


def _fault_step(meta, key: str) -> int:
    try:
        return int(meta[key])
    except ValueError:
        raise OptionError(f"Metadata.{key}: not a number") from None


def _enabled() -> bool:
    return os.environ.get("MLX_BACKEND_FAULT_INJECTION") == "1"


def requested_faults(meta: Mapping[str, str]) -> Tuple[List, str]:
    """(logits processors that fail at a token, the engine site that fails) asked by Metadata."""
    extra, fault = [], ""
    faults = _enabled()
    if faults and "fault_at_token" in meta:
        extra.append(rebuildable(injected_fault(_fault_step(meta, "fault_at_token")),
                                 "fault_at", _fault_step(meta, "fault_at_token")))
    if faults and meta.get("fault") in FAULT_SITES:
        fault = meta["fault"]
    return extra, fault


def grammar_fault(meta: Mapping[str, str]) -> int:
    """The token at which a request's grammar fails, or -1 (asked only when it has a grammar)."""
    faults = _enabled()
    return _fault_step(meta, "grammar_fault_at_token") if faults and "grammar_fault_at_token" in meta else -1
