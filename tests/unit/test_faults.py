"""Fault injection (engine/faults.py): nothing without MLX_BACKEND_FAULT_INJECTION=1, and with it
a request fails where its Metadata asked, with nothing kept on the Request itself."""

import gc

import pytest

from common.python_utils import OptionError
from engine import faults
from engine.requests import Request


def test_without_the_variable_metadata_asks_for_nothing(monkeypatch):
    monkeypatch.delenv("MLX_BACKEND_FAULT_INJECTION", raising=False)
    request = Request(prompt=[1], max_tokens=1)
    faults.attach(request, faults.plan({"fault": "admit", "fault_at_token": "3", "grammar_fault_at_token": "x"}))
    faults.check(request, "admit")  # does not raise
    assert faults.site_of(request) == ""


def test_a_request_fails_at_its_own_site_only(monkeypatch):
    monkeypatch.setenv("MLX_BACKEND_FAULT_INJECTION", "1")
    plan = faults.plan({"fault": "cache", "fault_at_token": "3"})
    assert (plan.at_token, plan.grammar_at) == (3, -1)
    request, other = Request(prompt=[1], max_tokens=1), Request(prompt=[1], max_tokens=1)
    faults.attach(request, plan)
    faults.check(request, "admit")
    faults.check(other, "cache")
    with pytest.raises(RuntimeError, match="injected fault at cache"):
        faults.check(request, "cache")
    assert faults.plan({"fault": "nowhere"}).site == ""


def test_a_token_that_is_no_number_is_an_option_error(monkeypatch):
    monkeypatch.setenv("MLX_BACKEND_FAULT_INJECTION", "1")
    with pytest.raises(OptionError, match="grammar_fault_at_token"):
        faults.plan({"grammar_fault_at_token": "soon"})


def test_the_processor_raises_past_its_token():
    processor = faults.processor(2)
    assert processor(None, "logits") == "logits" and processor(None, "logits") == "logits"
    with pytest.raises(RuntimeError, match="injected fault at token 2"):
        processor(None, "logits")


def test_a_finished_request_leaves_nothing_behind(monkeypatch):
    monkeypatch.setenv("MLX_BACKEND_FAULT_INJECTION", "1")
    faults.attach(Request(prompt=[1], max_tokens=1), faults.plan({"fault": "admit"}))
    gc.collect()
    assert len(faults._sites) == 0
