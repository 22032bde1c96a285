"""The helper names LocalAI's Python backends import from common/, and what they rely on.

LocalAI's mlx, mlx-vlm and mlx-distributed backends call split_reasoning and
parse_tool_calls on a finished reply, parse_options and messages_to_dicts on the
request, and get_auth_interceptors() when they build their server (which also
arms the parent watch and the model-identity guard). Stated here as our own cases.
"""

import asyncio
import importlib
import json
import os
import select
import subprocess
import sys
import threading
import types
from concurrent import futures

import grpc
import pytest
from hypothesis import given, settings, strategies as st

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from common import grpc_auth, model_identity, parent_watch  # noqa: E402
from common.launcher import backend_pb2, backend_pb2_grpc  # noqa: E402
from common.mlx_utils import OutputRouter, parse_tool_calls, split_reasoning  # noqa: E402
from common.python_utils import OptionError, messages_to_dicts, parse_load_options, parse_options  # noqa: E402

THINK = ("<think>", "</think>")
# No letter of "think" or "tool_call": generated text never forms a marker by accident,
# but does form the prefixes of one ("<", "</") that the router must hold back.
PROSE = st.text(alphabet="ab <>/\n.:", max_size=30)


def cuts_of(text, cuts):
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0] + points, points + [len(text)])]


def streamed(router, pieces):
    deltas = [d for p in pieces for d in router.feed(p)] + router.finalize()
    return ("".join(d.content for d in deltas), "".join(d.reasoning for d in deltas),
            [c for d in deltas for c in d.tool_calls])


# -- split_reasoning ----------------------------------------------------------


def test_split_reasoning_both_markers():
    assert split_reasoning("<think>one\ntwo</think>The answer is 42.", *THINK) == ("one\ntwo", "The answer is 42.")


def test_split_reasoning_reply_that_only_closes_the_block():
    # The template opened the block in the prompt: all before the close is reasoning.
    text = "Weather question.\n</think>\n\nIt is sunny in Rome."
    assert split_reasoning(text, *THINK) == ("Weather question.", "It is sunny in Rome.")


@pytest.mark.parametrize("text,start,end", [
    ("just text", *THINK), ("  spaced \n", *THINK), ("no opener here", "<think>", ""),
    ("", *THINK), ("a</think>b", "", "</think>"),
])
def test_split_reasoning_without_markers_returns_the_text_unchanged(text, start, end):
    assert split_reasoning(text, start, end) == ("", text)


def test_split_reasoning_close_before_a_later_block():
    # The first marker is a close: the reply began inside a block; the later block is reasoning too.
    assert split_reasoning("a</think>b<think>c</think>d", *THINK) == ("ac", "bd")


@settings(max_examples=300, deadline=None)
@given(reasoning=PROSE, content=PROSE, opened=st.booleans(), cuts=st.lists(st.integers(0, 80), max_size=8))
def test_split_reasoning_matches_the_stream_for_any_chunking(reasoning, content, opened, cuts):
    text = ("" if opened else THINK[0]) + reasoning + THINK[1] + content
    # The streaming face, chunked anyhow, keeps every character...
    router = OutputRouter(think_start=THINK[0], think_end=THINK[1], start_in_reasoning=opened)
    assert streamed(router, cuts_of(text, cuts))[:2] == (content, reasoning)
    # ...and the whole-text face gives the same split, trimmed.
    assert split_reasoning(text, *THINK) == (reasoning.strip(), content.strip())


# -- parse_tool_calls ---------------------------------------------------------


def city_module(end="</tool_call>"):
    return types.SimpleNamespace(
        tool_call_start="<tool_call>", tool_call_end=end,
        parse_tool_call=lambda body, tools: {"name": "get_weather", "arguments": {"location": body.strip()}})


def test_parse_tool_calls_with_a_duck_typed_module():
    calls, rest = parse_tool_calls("Sure: <tool_call>Paris</tool_call>", city_module(), tools=None)
    assert rest == "Sure:"
    assert [(c["index"], c["name"], c["arguments"]) for c in calls] == [(0, "get_weather", '{"location": "Paris"}')]
    assert calls[0]["id"]


def test_parse_tool_calls_numbers_calls_and_gives_distinct_ids():
    calls, rest = parse_tool_calls("<tool_call>Rome</tool_call> and <tool_call>Oslo</tool_call>.",
                                   city_module(), None)
    assert [json.loads(c["arguments"])["location"] for c in calls] == ["Rome", "Oslo"]
    assert [c["index"] for c in calls] == [0, 1] and calls[0]["id"] != calls[1]["id"]
    assert rest == "and ."


def test_parse_tool_calls_with_mlx_lm_modules():
    json_tools = importlib.import_module("mlx_lm.tool_parsers.json_tools")
    body = '{"name": "get_weather", "arguments": {"city": "Rome"}}'
    calls, rest = parse_tool_calls(f"{json_tools.tool_call_start}{body}{json_tools.tool_call_end}", json_tools, None)
    assert rest == "" and [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Rome"})]
    # Mistral has no end marker: the call runs to the end of the text, over several lines.
    mistral = importlib.import_module("mlx_lm.tool_parsers.mistral")
    body = 'get_weather[ARGS]{"city":\n "Oslo"}'
    calls, rest = parse_tool_calls("On it." + mistral.tool_call_start + body, mistral, None)
    expected = mistral.parse_tool_call(body)
    assert rest == "On it." and [(c["name"], json.loads(c["arguments"])) for c in calls] == \
        [(expected["name"], expected["arguments"])]


def test_parse_tool_calls_keeps_a_call_that_does_not_parse():
    module = city_module()
    module.parse_tool_call = lambda body, tools: json.loads(body)
    text = "Here <tool_call>not json</tool_call>"
    assert parse_tool_calls(text, module, None) == ([], text)


def test_parse_tool_calls_without_a_module_or_a_call():
    assert parse_tool_calls("<tool_call>x</tool_call>", None, None) == ([], "<tool_call>x</tool_call>")
    assert parse_tool_calls("  plain text ", city_module(), None) == ([], "  plain text ")


def test_parse_tool_calls_bare_json_to_an_offered_tool():
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    calls, rest = parse_tool_calls('{"name": "get_weather", "arguments": {"city": "Rome"}}', city_module(), tools)
    assert rest == "" and [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Rome"})]


@settings(max_examples=200, deadline=None)
@given(prose=st.lists(PROSE, min_size=1, max_size=4), cities=st.lists(st.sampled_from(["Rome", "Oslo", "Lima"]),
       max_size=3), cuts=st.lists(st.integers(0, 200), max_size=8))
def test_parse_tool_calls_matches_the_stream_for_any_chunking(prose, cities, cuts):
    prose = (prose * 4)[:len(cities) + 1]
    text = prose[0] + "".join(f"<tool_call>{c}</tool_call>{p}" for c, p in zip(cities, prose[1:]))
    module = city_module()
    router = OutputRouter(tool_start=module.tool_call_start, tool_end=module.tool_call_end,
                          tool_parser=module.parse_tool_call)
    content, _, streamed_calls = streamed(router, cuts_of(text, cuts))
    assert content == "".join(prose) and [json.loads(c.arguments)["location"] for c in streamed_calls] == cities
    calls, rest = parse_tool_calls(text, module, None)
    assert [json.loads(c["arguments"])["location"] for c in calls] == cities
    assert rest == ("".join(prose).strip() if cities else text)


# -- parse_options and messages_to_dicts -------------------------------------


def test_parse_options_skips_entries_without_a_colon_or_a_key():
    opts = parse_options(["temperature:0.7", "max_tokens:128", "trust:true", "name:hello", "no_colon", ":5", ""])
    assert opts == {"temperature": 0.7, "max_tokens": 128, "trust": True, "name": "hello"}
    assert type(opts["max_tokens"]) is int and type(opts["temperature"]) is float


def test_load_options_stay_strict():
    assert parse_load_options(["flag"]) == {"flag": True}
    with pytest.raises(OptionError, match="no key"):
        parse_load_options([":5"])


@given(st.lists(st.text(max_size=20), max_size=8))
def test_parse_options_never_raises(entries):
    opts = parse_options(entries)
    assert all(isinstance(k, str) and k for k in opts)
    assert len(opts) <= sum(1 for e in entries if ":" in e)


def message(**fields):
    base = dict(role="", content="", name="", tool_call_id="", reasoning_content="", tool_calls="")
    return types.SimpleNamespace(**{**base, **fields})


def calls_of(tool_calls, **kw):
    return messages_to_dicts([message(role="assistant", tool_calls=tool_calls)], **kw)[0].get("tool_calls")


def test_messages_to_dicts_fields():
    out = messages_to_dicts([message(role="user", content="hi"),
                             message(role="tool", content="42", tool_call_id="call_1", name="f")])
    assert out == [{"role": "user", "content": "hi"},
                   {"role": "tool", "content": "42", "tool_call_id": "call_1", "name": "f"}]


def test_messages_to_dicts_tool_call_arguments():
    def one(arguments):
        return json.dumps([{"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}])

    assert calls_of(one('{"location": "Rome"}'))[0]["function"]["arguments"] == {"location": "Rome"}
    assert calls_of(one({"a": 1}))[0]["function"]["arguments"] == {"a": 1}
    assert calls_of(one("not-json"))[0]["function"]["arguments"] == "not-json"


def test_messages_to_dicts_lenient_on_malformed_tool_calls():
    assert calls_of(json.dumps([{"id": "call_1"}])) == [{"id": "call_1"}]  # passed on as sent
    assert calls_of("{not json") is None  # left out
    assert calls_of('{"a": 1}') is None  # not an array: left out
    assert messages_to_dicts([message(content="x")]) == [{"role": "", "content": "x"}]


@pytest.mark.parametrize("tool_calls", ["{not json", json.dumps([{"id": "call_1"}])])
def test_messages_to_dicts_strict_names_the_message(tool_calls):
    with pytest.raises(OptionError, match=r"Messages\[0\]\.tool_calls"):
        calls_of(tool_calls, strict=True)


# -- get_auth_interceptors, model identity -----------------------------------


@pytest.fixture
def no_watch(monkeypatch):
    monkeypatch.setenv(parent_watch.ENV_PARENT_WATCH, "off")  # never arm a watch in the test process
    monkeypatch.delenv("LOCALAI_GRPC_AUTH_TOKEN", raising=False)
    return monkeypatch


def test_interceptors_without_a_token(no_watch):
    assert [type(i) for i in grpc_auth.get_auth_interceptors()] == [model_identity.ModelIdentityInterceptor]
    assert [type(i) for i in grpc_auth.get_auth_interceptors(aio=True)] == \
        [model_identity.AsyncModelIdentityInterceptor]


def test_interceptors_with_a_token_check_it_first(no_watch):
    no_watch.setenv("LOCALAI_GRPC_AUTH_TOKEN", "secret")
    assert [type(i) for i in grpc_auth.get_auth_interceptors()] == \
        [grpc_auth.TokenAuthInterceptor, model_identity.ModelIdentityInterceptor]
    assert [type(i) for i in grpc_auth.get_auth_interceptors(aio=True)] == \
        [grpc_auth.AsyncTokenAuthInterceptor, model_identity.AsyncModelIdentityInterceptor]


@pytest.mark.parametrize("loaded,requested,refused", [
    ("a", "b", True), ("a", "a", False), ("a", "", False), ("", "b", False), ("", "", False)])
def test_identity_rule(loaded, requested, refused):
    state = model_identity.ModelIdentityState()
    state.record(loaded)
    message = state.mismatch(requested)
    assert (message is not None) == refused
    if refused:
        assert model_identity.MODEL_MISMATCH_SENTINEL in message and loaded in message and requested in message


def test_guarded_methods():
    guarded = model_identity.GUARDED_METHODS
    for rpc in ("Predict", "PredictStream", "Embedding", "TokenizeString", "Rerank", "Score", "TTS", "Detect"):
        assert "/backend.Backend/" + rpc in guarded
    for rpc in ("Health", "LoadModel", "Free", "Status", "AudioEncode", "AudioDecode"):
        assert "/backend.Backend/" + rpc not in guarded


class Aborted(Exception):
    pass


class FakeContext:
    def abort(self, code, details):
        self.code, self.details = code, details
        raise Aborted(details)


def details(method):
    return types.SimpleNamespace(method="/backend.Backend/" + method, invocation_metadata=())


def request(model="", identity=""):
    return types.SimpleNamespace(Model=model, ModelIdentity=identity)


def test_sync_interceptor_records_the_load_and_guards():
    guard = model_identity.ModelIdentityInterceptor()

    def through(method, behavior, streaming=False):
        make = grpc.unary_stream_rpc_method_handler if streaming else grpc.unary_unary_rpc_method_handler
        handler = guard.intercept_service(lambda _: make(behavior), details(method))
        return handler.unary_stream if streaming else handler.unary_unary

    through("LoadModel", lambda r, c: types.SimpleNamespace(success=False))(request("a"), FakeContext())
    assert guard.state.loaded == ""
    through("LoadModel", lambda r, c: types.SimpleNamespace(success=True))(request("a"), FakeContext())
    assert guard.state.loaded == "a"
    assert through("Predict", lambda r, c: "served")(request(identity="a"), FakeContext()) == "served"
    assert through("Predict", lambda r, c: "served")(request(), FakeContext()) == "served"
    context = FakeContext()
    with pytest.raises(Aborted):
        through("PredictStream", lambda r, c: iter(["x"]), streaming=True)(request(identity="b"), context)
    assert context.code == grpc.StatusCode.NOT_FOUND and model_identity.MODEL_MISMATCH_SENTINEL in context.details
    health = grpc.unary_unary_rpc_method_handler(lambda r, c: "ok")
    assert guard.intercept_service(lambda _: health, details("Health")) is health


def test_async_interceptor_runs_sync_behaviour_off_the_event_loop():
    guard = model_identity.AsyncModelIdentityInterceptor()
    seen = {}

    def sync_load(r, c):
        seen["load"] = threading.get_ident()
        return types.SimpleNamespace(success=True)

    def sync_stream(r, c):
        seen["stream"] = threading.get_ident()
        yield "a"
        yield "b"

    async def async_stream(r, c):
        yield "c"

    async def async_predict(r, c):
        return "served"

    async def wrap(method, handler):
        async def continuation(_):
            return handler
        return await guard.intercept_service(continuation, details(method))

    async def scenario():
        loop_thread = threading.get_ident()
        load = await wrap("LoadModel", grpc.unary_unary_rpc_method_handler(sync_load))
        await load.unary_unary(request("a"), FakeContext())
        out = []
        for behavior in (sync_stream, async_stream):
            handler = await wrap("PredictStream", grpc.unary_stream_rpc_method_handler(behavior))
            out += [x async for x in handler.unary_stream(request(identity="a"), FakeContext())]
        predict = await wrap("Predict", grpc.unary_unary_rpc_method_handler(async_predict))
        out.append(await predict.unary_unary(request(identity="a"), FakeContext()))
        with pytest.raises(Aborted):
            await predict.unary_unary(request(identity="b"), FakeContext())
        return loop_thread, out

    loop_thread, out = asyncio.run(scenario())
    assert out == ["a", "b", "c", "served"] and guard.state.loaded == "a"
    assert seen["load"] != loop_thread and seen["stream"] != loop_thread


class TinyServicer(backend_pb2_grpc.BackendServicer):
    """A LocalAI-style servicer (sync and async methods mixed), nothing of ours behind it."""

    def LoadModel(self, request, context):
        return backend_pb2.Result(success=True, message="ok")

    async def Predict(self, request, context):
        return backend_pb2.Reply(message=b"served")


def test_a_localai_style_server_checks_the_token_before_the_identity(no_watch):
    no_watch.setenv("LOCALAI_GRPC_AUTH_TOKEN", "secret")

    async def scenario():
        server = grpc.aio.server(interceptors=grpc_auth.get_auth_interceptors(aio=True))
        backend_pb2_grpc.add_BackendServicer_to_server(TinyServicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = backend_pb2_grpc.BackendStub(channel)
                key = (("authorization", "Bearer secret"),)
                assert (await stub.LoadModel(backend_pb2.ModelOptions(Model="a"), metadata=key, timeout=10)).success
                answers = []
                for metadata, identity in ((key, "a"), (key, "b"), ((), "b"), ((), "a")):
                    try:
                        await stub.Predict(backend_pb2.PredictOptions(ModelIdentity=identity),
                                           metadata=metadata, timeout=10)
                        answers.append((grpc.StatusCode.OK, ""))
                    except grpc.aio.AioRpcError as e:
                        answers.append((e.code(), e.details()))
                return answers
        finally:
            await server.stop(None)

    answers = asyncio.run(scenario())
    assert [code for code, _ in answers] == [grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND,
                                             grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAUTHENTICATED]
    assert model_identity.MODEL_MISMATCH_SENTINEL in answers[1][1]
    assert all("'a'" not in text for _, text in answers[2:])  # nothing about the model without the token


def test_sync_token_interceptor_on_a_sync_server(no_watch):
    no_watch.setenv("LOCALAI_GRPC_AUTH_TOKEN", "secret")
    server = grpc.server(futures.ThreadPoolExecutor(2), interceptors=grpc_auth.get_auth_interceptors())

    class Sync(backend_pb2_grpc.BackendServicer):
        def Predict(self, request, context):
            return backend_pb2.Reply(message=b"served")

    backend_pb2_grpc.add_BackendServicer_to_server(Sync(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = backend_pb2_grpc.BackendStub(channel)
            assert stub.Predict(backend_pb2.PredictOptions(), metadata=(("authorization", "Bearer secret"),),
                                timeout=10).message == b"served"
            with pytest.raises(grpc.RpcError) as err:
                stub.Predict(backend_pb2.PredictOptions(), metadata=(("authorization", "Bearer nope"),), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        server.stop(None)


# -- the parent-watch entry point --------------------------------------------


def test_watch_settings_under_localai_names(monkeypatch):
    monkeypatch.delenv(parent_watch.ENV_PARENT_WATCH, raising=False)
    monkeypatch.setenv(parent_watch.ENV_PARENT_WATCH_INTERVAL, "500ms")
    assert parent_watch._enabled() and parent_watch._interval_seconds() == 0.5
    monkeypatch.setenv(parent_watch.ENV_PARENT_WATCH_INTERVAL, "garbage")
    assert parent_watch._interval_seconds() == parent_watch.DEFAULT_INTERVAL
    monkeypatch.setenv(parent_watch.ENV_PARENT_WATCH, " Off ")
    assert not parent_watch._enabled() and parent_watch.start_parent_death_watcher() is None


GRANDCHILD = """
import sys, time
sys.path.insert(0, sys.argv[1])
from common import parent_watch
first = parent_watch.start_parent_death_watcher()
assert first is not None and parent_watch.start_parent_death_watcher() is first  # armed once
print("armed", flush=True)
time.sleep(60)
"""

MIDDLE = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE,
                         pass_fds=(int(sys.argv[3]),), text=True)
print(child.stdout.readline().strip(), child.pid, flush=True)  # then exit: the child is orphaned
"""


@pytest.mark.skipif(os.name == "nt", reason="POSIX reparenting")
def test_death_watcher_exits_when_its_parent_dies():
    read_end, write_end = os.pipe()  # open in the grandchild until it exits
    env = {**os.environ, parent_watch.ENV_PARENT_WATCH_INTERVAL: "50ms"}
    env.pop(parent_watch.ENV_PARENT_WATCH, None)
    middle = subprocess.run([sys.executable, "-c", MIDDLE, GRANDCHILD, ROOT, str(write_end)], env=env,
                            pass_fds=(write_end,), capture_output=True, text=True, timeout=60)
    os.close(write_end)
    word, _, pid = middle.stdout.strip().partition(" ")
    try:
        assert word == "armed", middle.stderr
        ready, _, _ = select.select([read_end], [], [], 20)  # generous: the watch polls every 50 ms
        assert ready and os.read(read_end, 1) == b"", "the orphaned grandchild is still running"
    finally:
        os.close(read_end)
        try:
            os.kill(int(pid), 9)
        except (ValueError, ProcessLookupError):
            pass
