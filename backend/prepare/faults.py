"""Faults a test asks for in Metadata (only with MLX_BACKEND_FAULT_INJECTION=1), turned into
what the engine's fault module (engine/faults.py) consults: kept out of the product path."""

from typing import List, Tuple

from engine import faults

from .sampling import rebuildable


def requested_faults(meta) -> Tuple[List, faults.Plan]:
    """(logits processors that fail at a token, the whole plan) asked by Metadata."""
    plan = faults.plan(meta)
    extra = []
    if plan.at_token is not None:
        extra.append(rebuildable(faults.processor(plan.at_token), "fault_at", plan.at_token))
    return extra, plan


def grammar_processor(processor, source, plan: faults.Plan):
    """A request's grammar processor, failing where the plan says, rebuildable on other ranks."""
    return rebuildable(faults.grammar(processor, plan.grammar_at), "grammar", *source, plan.grammar_at)


def attach(request, plan: faults.Plan) -> None:
    """The engine site the request fails at, kept beside it (never a field of the Request)."""
    faults.attach(request, plan)
