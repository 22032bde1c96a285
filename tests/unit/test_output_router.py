"""OutputRouter: streamed channels equal a post-hoc split of the whole text, for any chunking."""

import importlib
import json
import logging
import os
import sys
import time
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from common.mlx_utils import OutputRouter, longest_partial_suffix  # noqa: E402

THINK = ("<think>", "</think>")
TOOL = ("<tool_call>", "</tool_call>")
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        },
    },
}
TOOLS = [WEATHER, {"type": "function", "function": {"name": "get_time", "parameters": {}}}]


def json_parser(text, tools=None):
    return json.loads(text.strip())


def chunked(text, cuts):
    """`text` split at the given positions (any chunking, empty chunks too); cuts wrap around."""
    if cuts == "each":
        return list(text)
    points = sorted({c % (len(text) + 1) for c in cuts})
    pieces, prev = [], 0
    for p in points + [len(text)]:
        pieces.append(text[prev:p])
        prev = p
    return pieces


def run(router, pieces):
    deltas = []
    for piece in pieces:
        deltas += router.feed(piece)
    deltas += router.finalize()
    return deltas


def collect(deltas):
    content = "".join(d.content for d in deltas)
    reasoning = "".join(d.reasoning for d in deltas)
    calls = [c for d in deltas for c in d.tool_calls]
    return content, reasoning, calls


def stream(text, pieces=None, **kw):
    kw.setdefault("think_start", THINK[0])
    kw.setdefault("think_end", THINK[1])
    kw.setdefault("tool_start", TOOL[0])
    kw.setdefault("tool_end", TOOL[1])
    kw.setdefault("tool_parser", json_parser)
    return collect(run(OutputRouter(**kw), pieces if pieces is not None else [text]))


# -- the non-streaming reference ---------------------------------------------


def ref_calls(parsed):
    items = parsed if isinstance(parsed, list) else [parsed]
    if not items or not all(isinstance(i, dict) and isinstance(i.get("name"), str) and i["name"] for i in items):
        raise ValueError("not a call")
    return [(i["name"], i.get("arguments", i.get("parameters")) or {}) for i in items]


def reference(text, think=THINK, tool=TOOL, parser=json_parser, start_in_reasoning=False):
    """The whole text split into (content, reasoning, [(name, args)]) in one pass.

    Markers only: bare JSON calls (tools offered) are checked against BARE_CASES.
    """
    ts, te = think
    cs, ce = tool
    edges = {
        "content": [(ts, "reasoning"), (cs, "tool"), (te, None), (ce, None)],
        "reasoning": [(te, "content"), (cs, "tool"), (ts, None), (ce, None)],
        "tool": [(ce, "content")],
    }
    edges = {k: [(m, n) for m, n in v if m] for k, v in edges.items()}
    content, reasoning, calls = [], [], []
    state, i = ("reasoning" if start_in_reasoning else "content"), 0

    def say(chan, s):
        chan.append(s)

    def close(body, end):
        try:
            calls.extend(ref_calls(parser(body, None)))
        except Exception:
            say(content, cs + body + end)

    while True:
        hits = [(text.find(m, i), -len(m), m, n) for m, n in edges[state] if text.find(m, i) >= 0]
        if not hits:
            rest = text[i:]
            if state == "tool":
                cut = len(rest) - longest_partial_suffix(rest, [ce] if ce else [])
                close(rest[:cut], rest[cut:])
            else:
                say(content if state == "content" else reasoning, rest)
            break
        at, _, marker, nxt = min(hits)
        if state == "tool":
            close(text[i:at], marker)
            state = "content"
        else:
            say(content if state == "content" else reasoning, text[i:at])
            state = nxt or state
        i = at + len(marker)
    return "".join(content), "".join(reasoning), calls


def as_pairs(calls):
    return [(c.name, json.loads(c.arguments)) for c in calls]


def check_calls(calls):
    assert [c.index for c in calls] == list(range(len(calls)))
    assert all(c.id for c in calls) and len({c.id for c in calls}) == len(calls)


# -- property tests ------------------------------------------------------------

WORDS = st.sampled_from(["Hello", " world", "é😀中", "\n", "  ", "a < b", "x>y", "{", "}", "[1]", "`", "/", "think", "<", "<th", "</tool_"])
GOOD_CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}'
FRAGMENTS = st.sampled_from(
    [
        *THINK,
        *TOOL,
        TOOL[0] + GOOD_CALL + TOOL[1],
        TOOL[0] + '\n{"name": "get_time"}\n' + TOOL[1],
        TOOL[0] + '{"name": oops' + TOOL[1],
        TOOL[0] + '"just a string"' + TOOL[1],
        TOOL[0] + GOOD_CALL,
        TOOL[0] + '{"name": "get_weather", "argu',
        GOOD_CALL,
        '{"name": "get_time", "parameters": {}}',
        '[{"name": "get_time", "arguments": {}}, ' + GOOD_CALL + "]",
        '{"name": "launch_rockets", "arguments": {}}',
        "```json\n" + GOOD_CALL + "\n```",
        "```\n" + GOOD_CALL,
        '{"name": "get_weather", "arguments": {"city": "Pa',
        '{"answer": 42}',
        '{"name": "get_weather", "arguments": {"city": "P\\"a}r]is"}}',
        "{not json}",
    ]
)
PARTS = st.lists(st.one_of(WORDS, FRAGMENTS), max_size=8).map("".join)
# Half the texts open with a fragment, where bare JSON is looked for.
LEADS = st.sampled_from(["", " ", "\n", "<think>x</think>\n", "<think>", "</think>"])
TEXTS = st.one_of(PARTS, st.tuples(LEADS, FRAGMENTS, PARTS).map("".join))
CUTS = st.one_of(st.just("each"), st.lists(st.integers(0, 10**6), max_size=30))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TEXTS, CUTS, st.booleans(), st.booleans())
def test_stream_equals_post_hoc_split(text, cuts, offer_tools, reasoning_first):
    kw = dict(tools=TOOLS if offer_tools else None, start_in_reasoning=reasoning_first)
    deltas = run(OutputRouter(think_start=THINK[0], think_end=THINK[1], tool_start=TOOL[0],
                              tool_end=TOOL[1], tool_parser=json_parser, **kw), chunked(text, cuts))
    content, reasoning, calls = collect(deltas)
    exp_content, exp_reasoning, exp_calls = reference(text, start_in_reasoning=reasoning_first)
    if offer_tools and exp_content.lstrip()[:1] in ("{", "[", "`"):
        # The content may open with a bare JSON call, which the marker-only
        # reference does not know (BARE_CASES checks those): here the result
        # must just not depend on the chunking.
        exp_content, exp_reasoning, exp_calls = collect(run(OutputRouter(
            think_start=THINK[0], think_end=THINK[1], tool_start=TOOL[0], tool_end=TOOL[1],
            tool_parser=json_parser, **kw), [text]))
        exp_calls = as_pairs(exp_calls)
    assert content == exp_content
    assert reasoning == exp_reasoning
    assert as_pairs(calls) == exp_calls
    check_calls(calls)
    for d in deltas:
        assert not any(m in d.reasoning for m in THINK + TOOL)
        # A marker reaches content only as part of the raw text of an unparsable call.
        if d.content and any(m in d.content for m in THINK + TOOL):
            assert TOOL[0] in d.content


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["<t", "/t>", "<tc>", "c>", "<", "t", "c", ">", "/", "x", " ", "é{"]), max_size=16)
       .map("".join), CUTS)
def test_any_chunking_with_overlapping_short_markers(text, cuts):
    """Short markers that overlap each other and the text: hold-back and leftmost-longest choice."""
    markers = dict(think_start="<t", think_end="/t>", tool_start="<tc>", tool_end="c>")

    def parser(body, tools=None):
        if body.strip() in ("x", "xx"):
            return {"name": body.strip(), "arguments": {}}
        raise ValueError(body)

    out = run(OutputRouter(tool_parser=parser, **markers), chunked(text, cuts))
    content, reasoning, calls = collect(out)
    expected = reference(text, think=("<t", "/t>"), tool=("<tc>", "c>"), parser=parser)
    assert (content, reasoning, as_pairs(calls)) == expected


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=list("<think>/tool_cal é\n{}"), max_size=60), CUTS)
def test_nothing_is_lost_when_no_call_parses(text, cuts):
    """With every call failing and no think markers, the content is the text itself."""

    def parser(body, tools=None):
        raise ValueError("never")

    out = run(OutputRouter(tool_start=TOOL[0], tool_end=TOOL[1], tool_parser=parser), chunked(text, cuts))
    assert collect(out) == (text, "", [])


@settings(max_examples=200, deadline=None)
@given(TEXTS, CUTS)
def test_held_back_tail_is_only_a_possible_marker(text, cuts):
    """Plain content (no markers configured but think) is held back only while it may be a marker."""
    text = text.replace(THINK[0], "").replace(THINK[1], "")
    router = OutputRouter(think_start=THINK[0], think_end=THINK[1])
    sent = ""
    seen = ""
    for piece in chunked(text, cuts):
        seen += piece
        sent += collect(router.feed(piece))[0]
        assert len(seen) - len(sent) == longest_partial_suffix(seen, list(THINK))
    assert sent + collect(router.finalize())[0] == text


# -- streaming behaviour ---------------------------------------------------------


def test_reasoning_streams_while_thinking_and_tails_are_held():
    r = OutputRouter(think_start="<think>", think_end="</think>")
    assert collect(r.feed("<thi")) == ("", "", [])
    assert collect(r.feed("nk>Let me")) == ("", "Let me", [])
    assert collect(r.feed(" see</th")) == ("", " see", [])
    assert collect(r.feed("ink>\n\nIt is 4 <")) == ("\n\nIt is 4 ", "", [])
    assert collect(r.feed("5")) == ("<5", "", [])
    assert r.finalize() == []


def test_reasoning_cut_before_think_end_stays_reasoning():
    r = OutputRouter(think_start="<think>", think_end="</think>")
    assert collect(r.feed("<think>still thinking </th")) == ("", "still thinking ", [])
    assert collect(r.finalize()) == ("", "</th", [])


def test_for_tokenizer_reads_markers_and_prompt_state():
    import mlx_lm.tool_parsers.json_tools as fmt

    tok = SimpleNamespace(
        has_thinking=True, think_start="<think>", think_end="</think>", has_tool_calling=True,
        tool_call_start=fmt.tool_call_start, tool_call_end=fmt.tool_call_end, tool_parser=fmt.parse_tool_call,
    )
    r = OutputRouter.for_tokenizer(tok, tools=TOOLS, prompt_text="<|im_start|>assistant\n<think>\n")
    text = "I need the weather.</think>\n<tool_call>\n" + GOOD_CALL + "\n</tool_call>"
    content, reasoning, calls = collect(run(r, list(text)))
    assert (content, reasoning) == ("\n", "I need the weather.")
    assert as_pairs(calls) == [("get_weather", {"city": "Paris", "days": 3})]
    assert r.tool_call_count == 1
    # The template closed the block itself (thinking off): the answer is content.
    r = OutputRouter.for_tokenizer(tok, prompt_text="assistant\n<think>\n\n</think>\n\n")
    assert collect(run(r, ["Hi"])) == ("Hi", "", [])
    # A plain object without any of the attributes: everything is content.
    r = OutputRouter.for_tokenizer(object(), prompt_text="<think>\n")
    assert collect(run(r, ["<think>a</think>"])) == ("<think>a</think>", "", [])
    # has_thinking False wins over marker attributes.
    tok.has_thinking = False
    r = OutputRouter.for_tokenizer(tok, prompt_text="<think>\n")
    assert collect(run(r, ["<think>a"])) == ("<think>a", "", [])


def test_start_in_reasoning():
    assert stream("plan</think>answer", start_in_reasoning=True) == ("answer", "plan", [])


def test_tool_start_inside_reasoning_opens_a_call():
    content, reasoning, calls = stream("<think>hm<tool_call>" + GOOD_CALL + "</tool_call>done")
    assert (content, reasoning, len(calls)) == ("done", "hm", 1)


def test_unterminated_call_at_finalize():
    content, _, calls = stream("Sure. <tool_call>\n" + GOOD_CALL + "\n</tool_")
    assert content == "Sure. "
    assert as_pairs(calls) == [("get_weather", {"city": "Paris", "days": 3})]
    half = '<tool_call>{"name": "get_weather", "arguments": {"ci'
    assert stream("Sure. " + half) == ("Sure. " + half, "", [])


def test_parser_exception_gives_the_raw_text_as_content(caplog):
    def broken(text, tools=None):
        return None.group(1)  # the AttributeError longcat raises on text it cannot read

    text = "a <tool_call>whatever</tool_call> b"
    with caplog.at_level(logging.WARNING, logger="mlx-backend.router"):
        assert stream(text, tool_parser=broken) == (text, "", [])
    assert stream("<tool_call>[]</tool_call>") == ("<tool_call>[]</tool_call>", "", [])


def test_parser_returning_a_list_gives_several_calls():
    def two(text, tools=None):
        return [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": '{"y": 2}', "id": "m1"}]

    _, _, calls = stream("<tool_call>x</tool_call><tool_call>y</tool_call>", tool_parser=two)
    check_calls(calls)
    assert [(c.name, c.arguments) for c in calls] == [("a", '{"x": 1}'), ("b", '{"y": 2}')] * 2
    assert calls[1].id == "m1" and calls[0].id.startswith("call_")


def test_router_failure_falls_back_to_plain_content(caplog, monkeypatch):
    r = OutputRouter(think_start="<think>", think_end="</think>", tool_start="<tool_call>",
                     tool_end="</tool_call>", tool_parser=json_parser)
    out = r.feed("<think>a</think>b <tool_call>{")

    def explode(*a, **k):
        raise RuntimeError("bug")

    monkeypatch.setattr(r, "_close_tool", explode)
    with caplog.at_level(logging.ERROR, logger="mlx-backend.router"):
        out += r.feed('"x": 1}</tool_call> c <think>')
        out += r.feed("d")
        out += r.finalize()
    assert collect(out) == ('b <tool_call>{"x": 1}</tool_call> c <think>d', "a", [])
    assert r.tool_call_count == 0
    assert len([rec for rec in caplog.records if rec.name == "mlx-backend.router"]) == 1
    assert r.feed("more") == [] and r.finalize() == []


def test_router_failure_in_finalize(monkeypatch):
    r = OutputRouter(tool_start="<tool_call>", tool_end="</tool_call>")
    out = r.feed("x <tool_call>{")
    monkeypatch.setattr(r, "_close_tool", lambda *a: 1 / 0)
    out += r.finalize()
    assert collect(out) == ("x <tool_call>{", "", [])


# -- bare JSON calls ---------------------------------------------------------------


def bare(text, pieces=None, tools=TOOLS):
    return stream(text, pieces, tools=tools)


# What a reply opening with bare JSON comes out as, written out by hand (the
# oracle for the router's bare-JSON recognition): (text, calls, content), calls
# as [(name, arguments)] or None when the text is plain content, content ""
# by default for calls and the text itself otherwise. Tools offered: TOOLS.
PARIS = ("get_weather", {"city": "Paris", "days": 3})
NOW = ("get_time", {})
BARE_CASES = [
    # A call: one object, or a list of them.
    (GOOD_CALL, [PARIS], None),
    ('{"name":"get_time","arguments":{}}', [NOW], None),
    ('[{"name": "get_time", "arguments": {}}, ' + GOOD_CALL + "]", [NOW, PARIS], None),
    ('[{"name": "get_time"}]', [NOW], None),
    # `parameters` instead of `arguments`; no arguments at all.
    ('{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}', [PARIS], None),
    ('{"name": "get_time", "parameters": {}}', [NOW], None),
    ('{"name": "get_time"}', [NOW], None),
    # Arguments as a JSON string holding an object.
    ('{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\", \\"days\\": 3}"}', [PARIS], None),
    # `id` and `type` may come along.
    ('{"id": "call_1", "type": "function", "name": "get_time", "arguments": {}}', [NOW], None),
    # Brackets and quotes inside strings do not end the value.
    ('{"name": "get_weather", "arguments": {"city": "P\\"a}r]is"}}', [("get_weather", {"city": 'P"a}r]is'})], None),
    # Leading blanks; text after the call is content.
    ("\n  " + GOOD_CALL, [PARIS], None),
    (" \t\n" + GOOD_CALL + " Done.", [PARIS], " Done."),
    (GOOD_CALL + "\n" + '{"name": "get_time", "arguments": {}}', [PARIS, NOW], None),
    ('{"name": "get_time", "arguments": {}}}', [NOW], "}"),  # the call ends where its value does
    # In a ``` fence, with or without a language; closed, or left open at the end.
    ("```json\n" + GOOD_CALL + "\n```", [PARIS], None),
    ("```\n" + GOOD_CALL + "```", [PARIS], None),
    ("```json " + GOOD_CALL + "\n```\n", [PARIS], "\n"),
    ("```json\n" + GOOD_CALL + "\n``` and then", [PARIS], " and then"),
    ("```\n[" + GOOD_CALL + "]\n```", [PARIS], None),
    ("```json\n" + GOOD_CALL + "\n", [PARIS], None),
    ("```json\n" + GOOD_CALL, [PARIS], None),
    # Not a call: content as it is.
    ('{"name": "launch_rockets", "arguments": {}}', None, None),  # a tool not offered
    ('[{"name": "get_time", "arguments": {}}, {"name": "launch", "arguments": {}}]', None, None),
    ('{"name": "get_time", "arguments": {}, "note": 1}', None, None),  # an extra key
    ('{"function": "get_time", "arguments": {}}', None, None),
    ('{"arguments": {"city": "Paris"}}', None, None),  # no name
    ('{"name": 7, "arguments": {}}', None, None),
    ('{"name": "get_time", "arguments": [1, 2]}', None, None),  # arguments not an object
    ('{"name": "get_time", "arguments": 5}', None, None),
    ('{"name": "get_time", "arguments": "now"}', None, None),  # a string that is not JSON
    ('{"name": "get_time", "arguments": "[1]"}', None, None),  # a JSON string, not an object
    ('[{"name": "get_time", "arguments": {}}, 3]', None, None),
    ("[]", None, None),
    ("{}", None, None),
    ("[[]]", None, None),
    ('{"answer": 42}', None, None),
    ("{this is prose}", None, None),
    ("{not json}", None, None),
    ("[1] Paris is the capital.", None, None),
    ("[Paris]", None, None),
    ("  {so} we start", None, None),
    ('{"name": "get_weather", "arguments": {"city": "Pa', None, None),  # cut short
    ("Answer: " + GOOD_CALL, None, None),  # not at the start
    ("```json\n" + GOOD_CALL + "\n``", None, None),  # a broken fence
    ("```json\n" + GOOD_CALL + "\nis what I would send", None, None),
    ("```python\nprint(1)\n```", None, None),
    ("```json\n{this}\n```", None, None),
    ("`x` is a variable", None, None),
    ("``` json\n" + GOOD_CALL + "\n```", None, None),
]
# What may come before: (text, reasoning, blanks that stay content unless a call follows).
BARE_LEADS = [("", "", ""), (" ", "", " "), ("\n\n", "", "\n\n"), ("<think>x</think>\n", "x", "\n"),
              ("<think>\n</think>", "\n", "")]


def expected_bare(case, lead=("", "", "")):
    text, calls, content = case
    _, reasoning, blanks = lead
    if calls is None:
        return (blanks + text, reasoning, [])
    return (content or "", reasoning, calls)


@pytest.mark.parametrize("case", BARE_CASES, ids=[repr(c[0])[:60] for c in BARE_CASES])
def test_bare_json_table(case):
    content, reasoning, calls = bare(case[0], list(case[0]))
    assert (content, reasoning, as_pairs(calls)) == expected_bare(case)
    check_calls(calls)
    # Without tools offered, it is all content.
    assert bare(case[0], tools=None) == (case[0], "", [])


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(BARE_CASES), st.sampled_from(BARE_LEADS), CUTS)
def test_bare_json_table_any_chunking(case, lead, cuts):
    text = lead[0] + case[0]
    content, reasoning, calls = bare(text, chunked(text, cuts))
    assert (content, reasoning, as_pairs(calls)) == expected_bare(case, lead)
    check_calls(calls)


def test_bare_json_after_thinking_and_split_across_chunks():
    text = "<think>call it</think>\n\n" + GOOD_CALL
    for size in (1, 2, 3, 7):
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        content, reasoning, calls = bare(text, pieces)
        assert (content, reasoning, len(calls)) == ("", "call it", 1)


def test_bare_json_undecided_at_end_is_content():
    half = '{"name": "get_weather", "arguments": {"city": "Pa'
    assert bare(half, list(half)) == (half, "", [])
    # Released at the end, it is routed like any content: here an unterminated call.
    text = '{"x": <tool_call>' + GOOD_CALL + "</tool_"
    content, _, calls = bare(text, list(text))
    assert content == '{"x": ' and as_pairs(calls) == [("get_weather", ARGS)]


def test_a_held_marker_prefix_is_not_the_start_of_bare_json():
    for first in ("<", "<th", " <tool_"):
        text = first + GOOD_CALL
        assert bare(text, [first, GOOD_CALL]) == (text, "", [])


def test_prose_starting_with_a_bracket_is_not_held_back():
    r = OutputRouter(tools=TOOLS)
    assert collect(r.feed("[1] Paris is")) == ("[1] Paris is", "", [])
    r = OutputRouter(tools=TOOLS)
    assert collect(r.feed("{this")) == ("{this", "", [])
    r = OutputRouter(tools=TOOLS)
    assert collect(r.feed("`x`")) == ("`x`", "", [])


# -- every tool format mlx-lm ships a parser for -------------------------------------

ARGS = {"city": "Paris", "days": 3}
FORMATS = {
    "json_tools": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
    "mistral": '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}',
    "pythonic": '<|tool_call_start|>[get_weather(city="Paris", days=3)]<|tool_call_end|>',
    "function_gemma": "<start_function_call>call:get_weather{city:<escape>Paris<escape>,days:3}<end_function_call>",
    "gemma4": '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>',
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
    '<|tool_call_argument_begin|>{"city": "Paris", "days": 3}<|tool_call_end|><|tool_calls_section_end|>',
    "glm47": "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
    "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>",
    "laguna": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
    "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
    "minimax_m2": '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
    '<parameter name="days">3</parameter>\n</invoke>\n</minimax:tool_call>',
    "longcat": "<longcat_tool_call>get_weather\n<longcat_arg_key>city</longcat_arg_key>\n"
    "<longcat_arg_value>Paris</longcat_arg_value>\n<longcat_arg_key>days</longcat_arg_key>\n"
    "<longcat_arg_value>3</longcat_arg_value>\n</longcat_tool_call>",
    "minicpm5": '<function name="get_weather"><param name="city">Paris</param><param name="days">3</param></function>',
    "muse_spark": '<atem:function_calls><atem:invoke name="get_weather"><atem:parameter name="city">Paris'
    '</atem:parameter><atem:parameter name="days">3</atem:parameter></atem:invoke></atem:function_calls>',
    "kimi_k3": '<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>'
    '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>'
    '<|open|>argument key="days" type="integer"<|sep|>3<|close|>argument<|sep|>'
    "<|close|>call<|sep|><|close|>tools<|sep|>",
}


@pytest.mark.parametrize("family", sorted(FORMATS))
@pytest.mark.parametrize("chunk", [1, 5, 10_000])
def test_tool_format(family, chunk):
    fmt = importlib.import_module(f"mlx_lm.tool_parsers.{family}")
    # Mistral's calls have no end marker: they run to the end of the reply.
    text = "<think>weather?</think>Checking." + FORMATS[family] + ("" if family == "mistral" else " Done.")
    router = OutputRouter(think_start="<think>", think_end="</think>", tool_start=fmt.tool_call_start,
                          tool_end=fmt.tool_call_end, tool_parser=fmt.parse_tool_call, tools=TOOLS)
    content, reasoning, calls = collect(run(router, [text[i : i + chunk] for i in range(0, len(text), chunk)]))
    assert reasoning == "weather?"
    assert content == "Checking." + ("" if family == "mistral" else " Done.")
    assert as_pairs(calls) == [("get_weather", ARGS)]
    check_calls(calls)
    if family == "kimi_k2":
        assert calls[0].id == "functions.get_weather:0"


def test_mistral_marker_is_not_taken_for_bare_json():
    import mlx_lm.tool_parsers.mistral as fmt

    text = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]'
    router = OutputRouter(tool_start=fmt.tool_call_start, tool_end=fmt.tool_call_end,
                          tool_parser=fmt.parse_tool_call, tools=TOOLS)
    content, _, calls = collect(run(router, list(text)))
    assert content == "" and as_pairs(calls) == [("get_weather", ARGS)]


# -- cost per token ----------------------------------------------------------------


def test_feed_cost_does_not_grow_with_history():
    """Long reasoning, a long call body and a long bare JSON, one character per feed."""
    big = '{"name": "get_weather", "arguments": {"city": "' + "x" * 60_000 + '"}}'
    text = "<think>" + "y" * 60_000 + "</think><tool_call>" + big + "</tool_call>"
    start = time.perf_counter()
    router = OutputRouter(think_start="<think>", think_end="</think>", tool_start="<tool_call>",
                          tool_end="</tool_call>", tool_parser=json_parser)
    _, reasoning, calls = collect(run(router, list(text)))
    _, _, bare_calls = collect(run(OutputRouter(tools=TOOLS), list(big)))
    assert len(reasoning) == 60_000 and len(calls) == len(bare_calls) == 1
    assert time.perf_counter() - start < 10  # quadratic work would take minutes
