"""Option and message helpers."""

import json

import pytest
from hypothesis import given, strategies as st

from common.python_utils import (OptionError, message_to_dict, option_float, option_int, parse_load_options,
                                 parse_options, parse_tools, parse_value)


def test_parse_load_options_types():
    opts = parse_load_options(["context_size:4096", "Temperature: 0.5", "use-openblas:true",
                               "enable_thinking:False", "name:smol", "url:http://x:1/y", "flag",
                               "kw:{\"a\": 1}", ""])
    assert opts == {"context_size": 4096, "temperature": 0.5, "use_openblas": True,
                    "enable_thinking": False, "name": "smol", "url": "http://x:1/y",
                    "flag": True, "kw": {"a": 1}}


def test_parse_load_options_rejects_missing_key():
    with pytest.raises(OptionError, match="no key"):
        parse_load_options([":5"])


@given(st.integers(-10**9, 10**9))
def test_integers_round_trip(n):
    assert parse_value(str(n)) == n
    assert parse_options([f"k:{n}"]) == {"k": n}


def test_typed_getters_name_the_option():
    with pytest.raises(OptionError, match="max_sequences"):
        option_int({"max_sequences": "many"}, "max_sequences", 8, minimum=1)
    with pytest.raises(OptionError, match="must be >= 1"):
        option_int({"max_sequences": 0}, "max_sequences", 8, minimum=1)
    with pytest.raises(OptionError, match="whole number"):
        option_int({"n": 1.5}, "n", 1)
    assert option_int({}, "n", 7) == 7
    assert option_float({"t": 1}, "t", 0.0) == 1.0
    with pytest.raises(OptionError, match="<= 1"):
        option_float({"top_p": 2}, "top_p", 1.0, 0.0, 1.0)


def test_message_tool_calls_round_trip():
    calls = [{"id": "c1", "type": "function",
              "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]
    msg = message_to_dict(0, "assistant", "", tool_calls=json.dumps(calls))
    assert msg["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    tool = message_to_dict(1, "tool", "22C", name="get_weather", tool_call_id="c1")
    assert tool == {"role": "tool", "content": "22C", "name": "get_weather", "tool_call_id": "c1"}


@pytest.mark.parametrize("bad,match", [
    ("not json", "not valid JSON"),
    ('{"a": 1}', "JSON list"),
    ('[{"function": {}}]', "function.name"),
])
def test_message_tool_calls_errors(bad, match):
    with pytest.raises(OptionError, match=match):
        message_to_dict(3, "assistant", "", tool_calls=bad)


def test_message_needs_role():
    with pytest.raises(OptionError, match=r"Messages\[2\]"):
        message_to_dict(2, "", "hi")


def test_parse_tools():
    assert parse_tools("") is None
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert parse_tools(json.dumps(tools)) == tools
    with pytest.raises(OptionError, match="Tools"):
        parse_tools("{")
