"""Text budgets: load options, JSON depth, the bounded template render, the one error map."""

import asyncio
import json
import threading
import time

import grpc
import pytest
from hypothesis import given, settings, strategies as st
from jinja2.sandbox import ImmutableSandboxedEnvironment

import backend
import backend_pb2
import limits
from common.python_utils import JSON_DEPTH, OptionError, load_json, parse_json_field, parse_tools
from engine import EngineError
from prepare.render_guard import RenderBudgetExceeded, bounded

# ---- load options ------------------------------------------------------------------


def test_defaults_without_options():
    assert limits.from_options({}) == limits.TextLimits()


@pytest.mark.parametrize("name", list(limits.RANGES))
def test_each_bound_is_an_option_checked_against_its_range(name):
    low, high = limits.RANGES[name]
    assert getattr(limits.from_options({name: high}), name) == high
    assert getattr(limits.from_options({name: low}), name) == low
    for bad in (low - 1, high * 2, "abc", True):
        with pytest.raises(OptionError, match=name):
            limits.from_options({name: bad})


def test_a_model_keeps_the_limits_it_was_loaded_with():
    class Model:
        text_limits = limits.TextLimits(max_messages=3)

    assert limits.of(Model()).max_messages == 3
    assert limits.of(object()) == limits.TextLimits()


# ---- JSON depth --------------------------------------------------------------------


def depth_of(value) -> int:
    """Nesting of lists and objects, written recursively (the reference)."""
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    return 0


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=3),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=2), c, max_size=3),
                    max_leaves=30)


@settings(max_examples=300)
@given(value=JSON, limit=st.integers(1, 12))
def test_load_json_refuses_exactly_what_nests_past_the_bound(value, limit):
    text = json.dumps(value)
    if depth_of(value) > limit:
        with pytest.raises(OptionError, match=f"field: JSON nested deeper than {limit}"):
            load_json("field", text, limit)
    else:
        assert load_json("field", text, limit) == value


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000])
def test_json_past_the_recursion_limit_is_an_option_error(text):
    with pytest.raises(OptionError, match="Tools: JSON nested deeper"):
        parse_json_field("Tools", text, list)
    with pytest.raises(OptionError, match="Tools"):
        parse_tools(text)


def test_tool_call_arguments_nested_deep_name_their_message():
    from common.python_utils import message_to_dict

    args = json.dumps("[" * (JSON_DEPTH + 1) + "]" * (JSON_DEPTH + 1))
    calls = '[{"function": {"name": "f", "arguments": %s}}]' % args
    with pytest.raises(OptionError, match=r"Messages\[2\]\.tool_calls"):
        message_to_dict(2, "assistant", "", tool_calls=calls)
    # Arguments that are not JSON at all still pass through verbatim.
    msg = message_to_dict(2, "assistant", "", tool_calls='[{"function": {"name": "f", "arguments": "x{"}}]')
    assert msg["tool_calls"][0]["function"]["arguments"] == "x{"


# ---- the bounded render ------------------------------------------------------------

ENV = ImmutableSandboxedEnvironment()


def test_a_render_under_its_budgets_is_untouched():
    t = ENV.from_string("{% for m in messages %}<{{ m }}>{% endfor %}")
    with bounded("Messages", 5.0, 1000):
        assert t.render(messages=["a", "b"]) == "<a><b>"


def test_nested_loops_without_output_end_at_the_deadline():
    t = ENV.from_string("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
    started = time.monotonic()
    with pytest.raises(RenderBudgetExceeded, match="template_seconds") as e:
        with bounded("Messages", 0.3, 1000):
            t.render()
    assert e.value.code == "RESOURCE_EXHAUSTED"
    assert time.monotonic() - started < 10  # the 10^10 turns would take hours


def test_output_past_its_budget_ends_the_render():
    t = ENV.from_string("{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}")
    with pytest.raises(RenderBudgetExceeded, match="template_output_bytes"):
        with bounded("Messages", 60.0, 10_000):
            t.render()


# Macros nested three deep inside a block: what the render returns is what counts, once.
NESTED = ("{% macro inner(x) %}[{{ x }}]{% endmacro %}"
          "{% macro outer(x) %}<{{ inner(x) }}{{ inner(x) }}>{% endmacro %}"
          "{% block body %}{% for m in messages %}{{ outer(m) }}{% endfor %}{% endblock %}")


@pytest.mark.parametrize("n", [1, 7, 40])
def test_the_output_bound_counts_what_the_render_returns_exactly(n):
    t = ENV.from_string(NESTED)
    messages = ["abc"] * n
    size = n * len("<[abc][abc]>")  # by hand: each message renders as <[abc][abc]>
    with bounded("Messages", 60.0, size):
        assert len(t.render(messages=messages)) == size
    with pytest.raises(RenderBudgetExceeded, match="template_output_bytes"):
        with bounded("Messages", 60.0, size - 1):
            t.render(messages=messages)


def test_the_bound_is_confined_to_its_thread_and_removed_after():
    import sys

    seen = []
    t = ENV.from_string("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
    other = threading.Thread(target=lambda: seen.append(sys.gettrace()))
    with pytest.raises(RenderBudgetExceeded):
        with bounded("Messages", 0.1, 1000):
            other.start()
            other.join()
            t.render()
    assert seen == [None] and sys.gettrace() is None


# ---- one error -> status map for every RPC -------------------------------------------


class Context:
    """The part of grpc.aio.ServicerContext the wrappers use."""

    def __init__(self):
        self.aborted = None

    async def abort(self, code, details):
        self.aborted = (code, details)
        raise grpc.aio.AbortError()


@pytest.mark.parametrize("error, code", [
    (OptionError("Tools: bad"), grpc.StatusCode.INVALID_ARGUMENT),
    (EngineError("RESOURCE_EXHAUSTED", "too long"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (AttributeError("a bug"), grpc.StatusCode.INTERNAL),
    (RecursionError("deep"), grpc.StatusCode.INTERNAL),
])
@pytest.mark.parametrize("streaming", [False, True])
def test_every_failure_leaves_with_a_known_code(error, code, streaming):
    async def handler(self, request, context):
        raise error

    async def stream(self, request, context):
        yield 1
        raise error

    async def run():
        context = Context()
        with pytest.raises(grpc.aio.AbortError):
            if streaming:
                async for _ in backend.answered_stream(stream)(None, None, context):
                    pass
            else:
                await backend.answered(handler)(None, None, context)
        return context.aborted

    got, details = asyncio.run(run())
    assert got == code
    assert str(error) in details


def test_every_rpc_of_the_service_goes_through_the_map():
    names = backend_pb2.DESCRIPTOR.services_by_name["Backend"].methods_by_name
    unwrapped = [n for n in names if not hasattr(getattr(backend.BackendServicer, n), "__wrapped__")]
    assert not unwrapped
