"""Fault injection, for tests only: one place the engine consults, nothing on product types.

With MLX_BACKEND_FAULT_INJECTION=1 in the environment, a request's Metadata may ask for a
failure: `fault` = a site where the engine fails it (admit, cache) or fails as a whole
(engine: its thread dies; loop: a dozen passes fail; failing: every pass fails for a while;
stall: one call blocks), `fault_at_token` = its logits processor raises at that token,
`grammar_fault_at_token` = its grammar is fed a forbidden token at that step. Preparation
asks `plan` what the Metadata wants and `attach`es the site to the Request; the engine asks
`site_of` / `check`. Without the variable nothing here does anything.
"""

import os
import time
import weakref
from dataclasses import dataclass
from typing import Optional

SITES = ("admit", "cache", "engine", "loop", "failing", "stall")  # where Metadata `fault` makes the engine fail
LOOP_FAULT_PASSES = 12  # how many passes in a row fault "loop" fails
FAULT_SECONDS = 5.0  # how long fault "failing" fails every pass, and "stall" blocks one

_sites: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # Request -> its site


class InjectedDeath(BaseException):
    """Kills the engine thread: tests of a dead engine only."""


@dataclass
class Plan:
    site: str = ""
    at_token: Optional[int] = None  # fault_at_token: its logits processor raises past this many calls
    grammar_at: int = -1  # grammar_fault_at_token (-1: never)


def enabled() -> bool:
    return os.environ.get("MLX_BACKEND_FAULT_INJECTION") == "1"


def plan(meta) -> Plan:
    """What a request's Metadata asks for (nothing unless fault injection is enabled);
    OptionError when a token number is not a number."""
    if not enabled():
        return Plan()
    return Plan(site=meta.get("fault") if meta.get("fault") in SITES else "",
                at_token=_step(meta, "fault_at_token", None), grammar_at=_step(meta, "grammar_fault_at_token", -1))


def _step(meta, key: str, absent):
    from common.python_utils import OptionError

    if key not in meta:
        return absent
    try:
        return int(meta[key])
    except ValueError:
        raise OptionError(f"Metadata.{key}: not a number") from None


def attach(request, p: Plan) -> None:
    if p.site:
        _sites[request] = p.site


def site_of(request) -> str:
    return _sites.get(request, "")


def check(request, site: str) -> None:
    """Raise where the request asked to fail."""
    if _sites.get(request) == site:
        raise RuntimeError(f"injected fault at {site}")


def processor(limit: int):
    """A logits processor that raises at the given step: fault-isolation tests only."""
    calls = [0]

    def call(tokens, logits):
        calls[0] += 1
        if calls[0] > limit:
            raise RuntimeError(f"injected fault at token {limit}")
        return logits

    return call


def grammar(processor, fault_at: int):
    """The grammar processor, fed a token its grammar forbids at step `fault_at` (-1: never)."""
    if fault_at >= 0:
        processor.fault_at = fault_at
    return processor


class Loop:
    """Faults of the engine loop as a whole, armed by a request at admission."""

    def __init__(self):
        self.passes = 0  # passes still to fail (fault "loop")
        self.until = 0.0  # monotonic time until which every pass fails (fault "failing")

    def at_admission(self, request) -> None:
        """At admission: the request's site, if it is one that fails more than the request."""
        check(request, "admit")
        site = site_of(request)
        if site == "engine":
            raise InjectedDeath("injected engine death")
        if site == "loop":
            self.passes = LOOP_FAULT_PASSES
        if site == "failing":
            self.until = time.monotonic() + FAULT_SECONDS
        if site == "stall":  # a call that does not return, as far as Health can tell
            time.sleep(FAULT_SECONDS)

    def at_pass(self, now: float) -> None:
        if self.passes or self.until > now:
            self.passes = max(self.passes - 1, 0)
            raise RuntimeError("injected fault in the engine loop")

