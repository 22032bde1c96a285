"""End-to-end: bad input fails alone and clearly; the server stays unharmed."""

import base64
import json
import math
import os
import threading

import grpc
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from common.launcher import backend_pb2, chat
from conftest import run_threads, serving

pytestmark = pytest.mark.e2e

IA = grpc.StatusCode.INVALID_ARGUMENT
RE = grpc.StatusCode.RESOURCE_EXHAUSTED
Q = "What is the capital of France?"
B64 = base64.b64encode(b"\x89PNG\r\n fake image").decode()


def msg(**kw):
    return backend_pb2.Message(**kw)


def meta(key, value):
    o = chat(Q, Tokens=2)
    o.Metadata[key] = value
    return o


def with_(**kw):
    o = chat(Q, Tokens=2)
    for k, v in kw.items():
        if isinstance(v, list):
            getattr(o, k).extend(v)
        else:
            setattr(o, k, v)
    return o


BAD_PREDICT = [
    ("TopP>1", with_(TopP=2.0), IA, "TopP"),
    ("TopP<0", with_(TopP=-0.1), IA, "TopP"),
    ("TopK<0", with_(TopK=-1), IA, "TopK"),
    ("Temperature<0", with_(Temperature=-1.0), IA, "Temperature"),
    ("Temperature nan", with_(Temperature=math.nan), IA, "Temperature"),
    ("Temperature inf", with_(Temperature=math.inf), IA, "Temperature"),
    ("MinP>1", with_(MinP=1.5), IA, "MinP"),
    ("MinP<0", with_(MinP=-0.5), IA, "MinP"),
    ("Penalty<0", with_(Penalty=-1.0), IA, "Penalty"),
    ("PresencePenalty big", with_(PresencePenalty=5.0), IA, "PresencePenalty"),
    ("FrequencyPenalty small", with_(FrequencyPenalty=-5.0), IA, "FrequencyPenalty"),
    ("TypicalP nan", with_(TypicalP=math.nan), IA, "TypicalP"),
    ("Tokens<0", with_(Tokens=-1), IA, "Tokens"),
    ("Tokens min int", with_(Tokens=-2**31), IA, "Tokens"),
    ("Logprobs<0", with_(Logprobs=-1), IA, "Logprobs"),
    ("Logprobs huge", with_(Logprobs=100), IA, "Logprobs"),
    ("TopLogprobs>20", with_(TopLogprobs=21), IA, "TopLogprobs"),
    ("LogitBias not json", with_(LogitBias="{"), IA, "LogitBias"),
    ("LogitBias list", with_(LogitBias="[]"), IA, "LogitBias"),
    ("LogitBias key", with_(LogitBias='{"x": 1}'), IA, "LogitBias"),
    ("LogitBias negative id", with_(LogitBias='{"-1": 1}'), IA, "LogitBias"),
    ("LogitBias value", with_(LogitBias='{"5": "a"}'), IA, "LogitBias"),
    ("LogitBias id past vocab", with_(LogitBias='{"99999999": 1}'), IA, "LogitBias"),
    ("Grammar unbalanced", with_(Grammar="root ::= ("), IA, "Grammar"),
    ("Grammar undefined rule", with_(Grammar="root ::= missing"), IA, "Grammar"),
    ("json_schema not json", meta("json_schema", "{oops"), IA, "json_schema"),
    ("json_schema bad type", meta("json_schema", '{"type": 12}'), IA, "json_schema"),
    ("response_format type", meta("response_format", '{"type": "xml"}'), IA, "response_format"),
    ("response_format not json", meta("response_format", "nope"), IA, "response_format"),
    ("enable_thinking", meta("enable_thinking", "maybe"), IA, "enable_thinking"),
    ("chat_template_kwargs list", meta("chat_template_kwargs", "[1]"), IA, "chat_template_kwargs"),
    ("chat_template_kwargs broken", meta("chat_template_kwargs", "{"), IA, "chat_template_kwargs"),
    ("Tools not json", with_(Tools="{"), IA, "Tools"),
    ("Tools object", with_(Tools='{"a": 1}'), IA, "Tools"),
    ("tool_calls not json", backend_pb2.PredictOptions(
        Messages=[msg(role="assistant", tool_calls="{")], UseTokenizerTemplate=True, Tokens=2), IA, "tool_calls"),
    ("tool_calls no name", backend_pb2.PredictOptions(
        Messages=[msg(role="assistant", tool_calls='[{"function": {}}]')], UseTokenizerTemplate=True, Tokens=2),
     IA, "tool_calls"),
    ("message without role", backend_pb2.PredictOptions(
        Messages=[msg(role="", content="hi")], UseTokenizerTemplate=True, Tokens=2), IA, "role"),
    ("empty prompt", backend_pb2.PredictOptions(Tokens=2), IA, "Prompt"),
    ("Images not base64", with_(Images=["!!!not base64!!!"]), IA, "Images"),
    ("Images for a text model", with_(Images=[B64]), IA, "Images"),
    ("Videos not base64", with_(Videos=["%%%"]), IA, "Videos"),
    ("Audios for a text model", with_(Audios=["data:audio/wav;base64," + B64]), IA, "Audios"),
    ("prompt past the context", backend_pb2.PredictOptions(Prompt="word " * 9000, Tokens=2), RE, "context"),
    ("identity mismatch", with_(ModelIdentity="some-other-model"), grpc.StatusCode.NOT_FOUND,
     "model identity mismatch"),
]


def healthy(stub):
    assert stub.Health(backend_pb2.HealthMessage(), timeout=5).message == b"OK"
    assert stub.Predict(chat(Q, Tokens=2), timeout=60).tokens == 2


@pytest.mark.parametrize("name,opts,code,needle", BAD_PREDICT, ids=[c[0] for c in BAD_PREDICT])
def test_bad_predict_input(server, name, opts, code, needle):
    stub = server.stub
    for call in (lambda: stub.Predict(opts, timeout=60), lambda: list(stub.PredictStream(opts, timeout=60))):
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == code, err.value.details()
        assert needle in err.value.details()
    healthy(stub)


def test_oversized_message_is_refused(server):
    with pytest.raises(grpc.RpcError) as err:
        server.stub.Predict(backend_pb2.PredictOptions(Prompt="x" * (65 * 1024 * 1024), Tokens=1), timeout=60)
    assert err.value.code() == RE
    healthy(server.stub)


def served(reply):
    """The reply carries generated text and counts: not an empty Reply."""
    assert reply.tokens > 0 and reply.prompt_tokens > 0, reply
    assert reply.message or any(d.content or d.reasoning_content or d.tool_calls for d in reply.chat_deltas), reply


def test_odd_but_valid_input_is_served(server):
    stub = server.stub
    plain = stub.Predict(chat(Q, Tokens=2), timeout=120)
    served(plain)
    for opts in (with_(Seed=-2**31), with_(Seed=2**31 - 1), with_(StopPrompts=["", "\x00"]),
                 with_(TopK=10**9), with_(Threads=-5, Batch=-1), meta("unknown_key", "x"),
                 with_(Prompt="ignored when Messages are templated")):
        reply = stub.Predict(opts, timeout=120)
        served(reply)
        # Greedy decoding of the same messages: the odd field changes nothing.
        assert (reply.message, reply.tokens, reply.prompt_tokens) == \
            (plain.message, plain.tokens, plain.prompt_tokens), opts
    # The largest budget is capped by the context; the reply ends as usual, at the
    # end of the sequence, long before the context is full.
    reply = stub.Predict(with_(Tokens=2**31 - 1, Temperature=1e-7), timeout=120)
    served(reply)
    assert reply.prompt_tokens == plain.prompt_tokens
    assert plain.tokens < reply.tokens < 1000, reply.tokens
    assert reply.message.startswith(plain.message)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    (d / "garbage.gguf").write_bytes(b"GGUF" + os.urandom(256))
    (d / "notes.txt").write_text("not a model")
    (d / "empty-dir").mkdir()
    vision = d / "vision-model"
    vision.mkdir()
    (vision / "config.json").write_text(json.dumps({"model_type": "llava", "vision_config": {"x": 1}}))
    return d


@pytest.mark.parametrize("name,fields,needle", [
    ("missing file", {"Model": "nope.gguf"}, "not found"),
    ("garbage gguf", {"Model": "garbage.gguf"}, "garbage.gguf"),
    ("not a gguf", {"Model": "notes.txt"}, ".gguf"),
    ("dir without config", {"Model": "empty-dir"}, "config.json"),
    ("vision model", {"Model": "vision-model"}, "vision"),
    ("negative context", {"Model": "", "ContextSize": -1}, "ContextSize"),
    ("bad dtype", {"Model": "", "DType": "float8"}, "DType"),
    ("bad option value", {"Model": "", "Options": ["max_sequences:0"]}, "max_sequences"),
    ("option without key", {"Model": "", "Options": [":x"]}, "no key"),
    ("option not a bool", {"Model": "", "Options": ["enable_thinking:maybe"]}, "enable_thinking"),
])
def test_bad_load_keeps_the_loaded_model(server, scratch, name, fields, needle):
    result = server.stub.LoadModel(backend_pb2.ModelOptions(ModelPath=str(scratch), **fields), timeout=300)
    assert not result.success
    assert needle in result.message
    healthy(server.stub)


def fuzz_options():
    floats = st.floats(allow_nan=True, allow_infinity=True, width=32)
    # JSON nested under the depth bound, just past it, and past Python's recursion limit.
    deep = st.sampled_from([3, 65, 5000]).flatmap(
        lambda n: st.sampled_from(["[" * n + "]" * n, '{"a":' * n + "1" + "}" * n]))
    small = st.one_of(st.integers(-3, 3), st.integers(-2**31, 2**31 - 1))
    return st.builds(
        backend_pb2.PredictOptions,
        Prompt=st.text(max_size=60),
        Tokens=st.sampled_from([-1, 1, 2, 3]),
        Temperature=floats, TopP=floats, MinP=floats, Penalty=floats,
        PresencePenalty=floats, FrequencyPenalty=floats, TopK=small, Seed=small,
        Logprobs=small, TopLogprobs=small, IgnoreEOS=st.booleans(),
        StopPrompts=st.lists(st.text(max_size=4), max_size=3),
        LogitBias=st.one_of(st.just(""), st.text(max_size=12), deep,
                            st.dictionaries(st.integers(-5, 60000).map(str), st.floats(-200, 200), max_size=3)
                            .map(json.dumps)),
        Grammar=st.one_of(st.just(""), st.just('root ::= ("a" | "b")'), st.text(max_size=12)),
        Metadata=st.dictionaries(st.sampled_from(["enable_thinking", "json_schema", "chat_template_kwargs",
                                                  "reasoning_effort", "response_format", "x"]),
                                 st.one_of(st.text(max_size=10), deep), max_size=2),
        Tools=st.one_of(st.just(""), st.text(max_size=10), deep),
        UseTokenizerTemplate=st.booleans(),
        Messages=st.lists(st.builds(backend_pb2.Message, role=st.sampled_from(["user", "assistant", "", "x"]),
                                    content=st.text(max_size=20),
                                    tool_calls=st.one_of(st.just(""), st.text(max_size=8), deep)), max_size=2),
    )


ALLOWED = {IA, RE, grpc.StatusCode.NOT_FOUND}


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(opts=fuzz_options(), stream=st.booleans())
def test_fuzzed_predict_options(server, opts, stream):
    stub = server.stub
    try:
        if stream:
            replies = list(stub.PredictStream(opts, timeout=120))
            assert replies and all(isinstance(r, backend_pb2.Reply) for r in replies)
            assert replies[-1].tokens <= max(opts.Tokens, 0) + 1
        else:
            reply = stub.Predict(opts, timeout=120)
            assert reply.tokens <= max(opts.Tokens, 0)
    except grpc.RpcError as e:
        assert e.code() in ALLOWED, (e.code(), e.details())
    assert stub.Health(backend_pb2.HealthMessage(), timeout=5).message == b"OK"


@pytest.fixture(scope="module")
def faulty(log_dir):
    """A server with fault injection switched on (Metadata fault_at_token)."""
    yield from serving(log_dir / "faulty.log", env={"MLX_BACKEND_FAULT_INJECTION": "1"})


def test_a_failing_request_fails_alone(faulty):
    stub = faulty.stub
    questions = [Q, "Name three colors.", "What is 2 + 2?"]
    solo = [stub.Predict(chat(q, Tokens=12), timeout=120).message for q in questions]
    bad = chat("Write a poem about rain.", Tokens=30)
    bad.Metadata["fault_at_token"] = "3"

    def good(q):
        return lambda: b"".join(c.message for c in stub.PredictStream(chat(q, Tokens=12), timeout=120))

    results = run_threads([lambda: list(stub.PredictStream(bad, timeout=120))] + [good(q) for q in questions])
    assert isinstance(results[0], grpc.RpcError)
    assert results[0].code() == grpc.StatusCode.INTERNAL
    assert "injected fault" in results[0].details()
    assert results[1:] == solo
    healthy(stub)


def long_streamer(stub, topic, started):
    """A long stream that sets `started` once two chunks have arrived."""
    def run():
        for i, _ in enumerate(stub.PredictStream(chat(f"Write a long essay about {topic}.", Tokens=200),
                                                 timeout=120)):
            if i == 1:
                started.set()
        return "finished"
    return run


def test_free_during_streams_aborts_them_cleanly(faulty):
    stub = faulty.stub
    started = threading.Event()
    streamer = long_streamer(stub, "rivers", started)

    def freer():
        assert started.wait(60)
        return stub.Free(backend_pb2.HealthMessage(), timeout=30)

    results = run_threads([streamer, streamer, freer])
    for r in results[:2]:
        assert isinstance(r, grpc.RpcError) and r.code() == grpc.StatusCode.ABORTED, r
        assert "unloaded or replaced" in r.details()
    assert results[2].success
    assert faulty.load("").success
    healthy(stub)


def test_load_during_a_stream_replaces_the_model(faulty):
    stub = faulty.stub
    started = threading.Event()
    streamer = long_streamer(stub, "lakes", started)

    def loader():
        assert started.wait(60)
        return faulty.load("")

    stream_result, load_result = run_threads([streamer, loader])
    assert load_result.success
    assert isinstance(stream_result, grpc.RpcError) and stream_result.code() == grpc.StatusCode.ABORTED
    healthy(stub)
