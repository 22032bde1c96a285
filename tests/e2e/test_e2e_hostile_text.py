"""End-to-end: a hostile client's text never steers the template, wedges preparation or
bombs the process.

Each case is sent as a client would send it, through the real server with a real
model: it must end with a clear code naming the field within a generous time, the
server's memory high-water mark (VmHWM) must grow little during it, and an
ordinary chat sent next to it must be served.
"""

import json
import os
import shutil
import time

import grpc
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from common.launcher import backend_pb2, chat
from conftest import run_threads, serving
from peak_rss import peak_growth_mb

pytestmark = pytest.mark.e2e

INVALID = grpc.StatusCode.INVALID_ARGUMENT
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
WITHIN_S = 25.0  # well under the 60 s the calls are given
MIB = 1024 * 1024


def ordinary(stub):
    return stub.Predict(chat("Say hi.", Tokens=3, Temperature=0), timeout=60)


def refused(backend, call, code, *names, rss_mb=150.0):
    """`call` fails with `code`, its message naming every one of `names`, within WITHIN_S;
    the server's high-water RSS grows under `rss_mb`; an ordinary chat next to it is served."""
    started = time.monotonic()
    (hostile, normal), grown = peak_growth_mb(
        backend.proc.pid, lambda: run_threads([call, lambda: ordinary(backend.stub)]))
    elapsed = time.monotonic() - started
    assert isinstance(hostile, grpc.RpcError), f"accepted: {str(hostile)[:200]}"
    assert hostile.code() == code, (hostile.code(), hostile.details())
    for name in names:
        assert name in hostile.details(), hostile.details()
    assert elapsed < WITHIN_S, elapsed
    assert grown < rss_mb, f"VmHWM grew {grown:.0f} MB"
    assert not isinstance(normal, grpc.RpcError), normal
    assert normal.tokens > 0
    return hostile.details()


def with_metadata(opts, **metadata):
    for k, v in metadata.items():
        opts.Metadata[k] = v
    return opts


def deep_array(depth: int) -> str:
    return "[" * depth + "]" * depth


def deep_object(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


# ---- 1. the model's template is the only template -------------------------------------


@pytest.mark.parametrize("key", ["chat_template", "tokenize", "return_dict", "return_tensors",
                                 "add_generation_prompt", "continue_final_message", "messages", "tools",
                                 "documents", "tokenizer_kwargs"])
def test_template_kwargs_that_steer_the_renderer_are_refused(server, key):
    value = "PWNED {{ messages[0]['content'] }}" if key == "chat_template" else True
    opts = with_metadata(chat("hi"), chat_template_kwargs=json.dumps({key: value}))
    refused(server, lambda: server.stub.TokenizeString(opts, timeout=60), INVALID,
            "Metadata.chat_template_kwargs", repr(key))


def test_an_injected_template_never_reaches_generation(server):
    opts = with_metadata(chat("hi", Tokens=2),
                         chat_template_kwargs=json.dumps({"chat_template": "PWNED {{ messages[0]['content'] }}"}))
    refused(server, lambda: list(server.stub.PredictStream(opts, timeout=60)), INVALID, "'chat_template'")


def test_template_variables_still_reach_the_template(server):
    from transformers import AutoTokenizer

    from loaders.gguf_loader import gguf_to_mlx_dir
    from loaders.model_loader import embedded_default

    hf = AutoTokenizer.from_pretrained(str(gguf_to_mlx_dir(embedded_default())))
    opts = with_metadata(chat("hi"), chat_template_kwargs=json.dumps({"some_flag": True}))
    got = server.stub.TokenizeString(opts, timeout=60).tokens
    want = hf.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                  tokenize=False, some_flag=True)
    assert list(got) == hf.encode(want, add_special_tokens=False)


# ---- 7 and 9. JSON depth: INVALID_ARGUMENT naming the field, never INTERNAL -----------

DEEP = 100_000


def _deep_cases():
    call = '[{"id": "c", "type": "function", "function": {"name": "f", "arguments": %s}}]'
    return {
        "Tools": lambda o: setattr(o, "Tools", deep_array(DEEP)),
        "Metadata.json_schema": lambda o: o.Metadata.__setitem__("json_schema", deep_object(DEEP)),
        "Metadata.response_format": lambda o: o.Metadata.__setitem__("response_format", deep_object(DEEP)),
        "Metadata.chat_template_kwargs": lambda o: o.Metadata.__setitem__("chat_template_kwargs",
                                                                          deep_object(DEEP)),
        "LogitBias": lambda o: setattr(o, "LogitBias", deep_object(DEEP)),
        "Messages[1].tool_calls": lambda o: o.Messages.add(role="assistant", content="",
                                                           tool_calls=call % deep_object(DEEP)),
        # The arguments as OpenAI sends them: a JSON string holding the JSON.
        "Messages[1].tool_calls ": lambda o: o.Messages.add(
            role="assistant", content="", tool_calls=call % json.dumps(deep_object(DEEP))),
    }


@pytest.mark.parametrize("field", list(_deep_cases()))
def test_json_nested_deep_is_invalid_argument(server, field):
    opts = chat("hi", Tokens=2)
    _deep_cases()[field](opts)
    refused(server, lambda: server.stub.Predict(opts, timeout=60), INVALID, field.strip(), "nested deeper")


def test_json_just_past_the_depth_bound_is_refused_and_just_under_is_served(server):
    over = chat("hi", Tokens=2, Tools=json.dumps([{"type": "function", "function": {"name": "f"}, "x": 0}])
                .replace('"x": 0', '"x": ' + deep_array(64)))
    refused(server, lambda: server.stub.Predict(over, timeout=60), INVALID, "Tools", "64")
    under = chat("hi", Tokens=2, Tools=json.dumps([{"type": "function", "function": {"name": "f"}, "x": 0}])
                 .replace('"x": 0', '"x": ' + deep_array(60)))
    assert server.stub.Predict(under, timeout=60).tokens > 0


# ---- 9. text bounds, before rendering or tokenizing -----------------------------------


def test_too_many_stop_strings(server):
    opts = chat("hi", Tokens=2, StopPrompts=[f"stop{i}" for i in range(33)])
    refused(server, lambda: server.stub.Predict(opts, timeout=60), INVALID, "StopPrompts", "32")


def test_a_stop_string_too_long(server):
    opts = chat("hi", Tokens=2, StopPrompts=["x" * 513])
    refused(server, lambda: server.stub.Predict(opts, timeout=60), INVALID, "StopPrompts[0]", "512")


def test_stop_strings_too_long_together(server):
    opts = chat("hi", Tokens=2, StopPrompts=[chr(65 + i) * 500 for i in range(9)])
    refused(server, lambda: server.stub.Predict(opts, timeout=60), INVALID, "StopPrompts", "4096")


def test_a_prompt_over_its_byte_bound_is_refused_before_tokenizing(server):
    opts = backend_pb2.PredictOptions(Prompt="word " * (2 * MIB), Tokens=2)  # 10 MiB
    refused(server, lambda: server.stub.Predict(opts, timeout=60), INVALID, "max_prompt_bytes")
    refused(server, lambda: server.stub.TokenizeString(opts, timeout=60), INVALID, "max_prompt_bytes")


def test_a_grammar_or_logit_bias_over_the_byte_bound_is_refused_before_compiling(server):
    # llguidance compiles a grammar on a preparation thread: 9 MiB of rules is refused unread.
    grammar = "root ::= " + " | ".join(f'"w{i}"' for i in range(900_000))
    refused(server, lambda: server.stub.Predict(chat("hi", Tokens=2, Grammar=grammar), timeout=60),
            INVALID, "Grammar", "max_prompt_bytes")
    bias = "{" + ",".join(f'"{i}": 0' for i in range(1_000_000)) + "}"
    refused(server, lambda: server.stub.Predict(chat("hi", Tokens=2, LogitBias=bias), timeout=60),
            INVALID, "LogitBias", "max_prompt_bytes")


def test_messages_over_their_byte_bound_are_refused_before_rendering(server):
    opts = chat("hi", Tokens=2)
    for _ in range(20):
        opts.Messages.add(role="user", content="y" * (MIB // 2))
    refused(server, lambda: server.stub.TokenizeString(opts, timeout=60), INVALID, "max_prompt_bytes")


def test_embedding_score_and_rerank_texts_over_the_byte_bound(server):
    stub, big = server.stub, "word " * (2 * MIB)  # 10 MiB
    refused(server, lambda: stub.Embedding(backend_pb2.PredictOptions(Embeddings=big), timeout=60), INVALID,
            "Embeddings", "max_prompt_bytes")
    refused(server, lambda: stub.Score(backend_pb2.ScoreRequest(prompt=big, candidates=["a"]), timeout=60),
            INVALID, "prompt and candidates", "max_prompt_bytes")
    documents = ["y" * (MIB // 2)] * 20
    refused(server, lambda: stub.Rerank(backend_pb2.RerankRequest(query="q", documents=documents), timeout=60),
            INVALID, "query and documents", "max_prompt_bytes")


def test_too_many_messages(server):
    opts = chat("hi", Tokens=2)
    for _ in range(4096):
        opts.Messages.add(role="user", content="hi")
    refused(server, lambda: server.stub.Predict(opts, timeout=60), INVALID, "Messages", "4096")


def test_detokenize_of_too_many_ids(server):
    ids = backend_pb2.DetokenizeRequest(tokens=[1] * ((1 << 20) + 1))
    refused(server, lambda: server.stub.Detokenize(ids, timeout=60), INVALID, "tokens", str(1 << 20))


def test_detokenize_of_ids_out_of_range_names_them(server):
    ids = backend_pb2.DetokenizeRequest(tokens=[1, 2, 10_000_000])
    refused(server, lambda: server.stub.Detokenize(ids, timeout=60), INVALID, "tokens", "10000000")


# ---- 7. one error path: an encoder model asked for a chat ------------------------------


@pytest.fixture(scope="module")
def encoder(log_dir):
    from models import minilm_dir

    yield from serving(log_dir / "hostile-encoder.log", minilm_dir())


def test_tokenize_messages_on_an_encoder_is_a_clear_error(encoder):
    with pytest.raises(grpc.RpcError) as e:
        encoder.stub.TokenizeString(chat("hi"), timeout=60)
    assert e.value.code() == INVALID, (e.value.code(), e.value.details())
    assert "Messages" in e.value.details()
    assert encoder.stub.TokenizeString(backend_pb2.PredictOptions(Prompt="hi"), timeout=60).length > 0


# ---- 2. a model's own template, bounded in time and output -----------------------------

# Slow or huge only when the first message asks for it, so ordinary chats render at once.
HOSTILE_PREAMBLE = (
    "{% if messages[0]['content'] == 'slow' %}"
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}"
    "{% if messages[0]['content'] == 'huge' %}"
    "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}{% endif %}"
)


@pytest.fixture(scope="module")
def hostile_template(log_dir, tmp_path_factory):
    from loaders.gguf_loader import gguf_to_mlx_dir
    from loaders.model_loader import embedded_default

    src = gguf_to_mlx_dir(embedded_default())
    model = tmp_path_factory.mktemp("hostile-template")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        os.symlink(src / name, model / name)
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    template = cfg.pop("chat_template", None) or (src / "chat_template.jinja").read_text()
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    (model / "chat_template.jinja").write_text(HOSTILE_PREAMBLE + template)
    try:
        yield from serving(log_dir / "hostile-template.log", str(model), Options=["template_seconds:2"])
    finally:
        shutil.rmtree(model, ignore_errors=True)


def test_slow_template_renders_end_and_never_block_an_ordinary_chat(hostile_template):
    stub = hostile_template.stub
    slow = [lambda: stub.Predict(chat("slow", Tokens=2), timeout=60) for _ in range(3)]
    started = time.monotonic()
    *hostile, normal = run_threads(slow + [lambda: ordinary(stub)])
    assert time.monotonic() - started < WITHIN_S
    assert not isinstance(normal, grpc.RpcError), normal
    for h in hostile:
        assert isinstance(h, grpc.RpcError) and h.code() == EXHAUSTED, h
        assert "template_seconds" in h.details(), h.details()


def test_huge_template_output_is_cut_at_its_bound(hostile_template):
    opts = chat("huge", Tokens=2)
    refused(hostile_template, lambda: hostile_template.stub.TokenizeString(opts, timeout=60), EXHAUSTED,
            "template_output_bytes", rss_mb=250)


def test_a_bound_option_out_of_range_fails_the_load(log_dir):
    from common.launcher import Backend

    with Backend(log_path=str(log_dir / "hostile-options.log")) as b:
        for option in ("template_seconds:0", "max_json_depth:100000", "max_stop_strings:abc"):
            result = b.load("", Options=[option])
            assert not result.success
            assert option.split(":")[0] in result.message, result.message


# ---- a fuzz of the JSON fields of an otherwise valid chat: never UNKNOWN or INTERNAL ----

TEXT = st.text(max_size=20)
JSONISH = st.one_of(
    TEXT, st.sampled_from(["", "{}", "[]", "null", "1e999", '{"type": "json_object"}', '{"a": NaN}']),
    # Nesting under the bound, just past it, and past Python's recursion limit.
    st.sampled_from([3, 65, 5000]).flatmap(lambda n: st.sampled_from([deep_array(n), deep_object(n)])),
    st.recursive(st.none() | st.booleans() | st.integers() | TEXT,
                 lambda c: st.lists(c, max_size=3) | st.dictionaries(TEXT, c, max_size=3), max_leaves=8)
    .map(json.dumps))
JSON_FIELDS = st.fixed_dictionaries({}, optional={
    "Tools": JSONISH, "LogitBias": JSONISH, "json_schema": JSONISH, "response_format": JSONISH,
    "chat_template_kwargs": JSONISH, "tool_calls": JSONISH,
    "StopPrompts": st.lists(st.text(max_size=600), max_size=40),
})


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(fields=JSON_FIELDS, rpc=st.sampled_from(["Predict", "TokenizeString"]))
def test_fuzzed_json_fields_get_a_clear_answer(server, fields, rpc):
    opts = chat("hi", Tokens=2)
    for name, value in fields.items():
        if name in ("Tools", "LogitBias"):
            setattr(opts, name, value)
        elif name == "tool_calls":
            opts.Messages.add(role="assistant", content="", tool_calls=value)
        elif name == "StopPrompts":
            opts.StopPrompts.extend(value)
        else:
            opts.Metadata[name] = value
    try:
        getattr(server.stub, rpc)(opts, timeout=60)
    except grpc.RpcError as e:
        assert e.code() in (INVALID, EXHAUSTED), (e.code(), e.details())
    assert server.proc.poll() is None
