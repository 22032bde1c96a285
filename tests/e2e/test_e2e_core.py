"""End-to-end: the real server process, the real SmolLM2 GGUF, over gRPC."""

import statistics
import threading
import time

import grpc
import pytest

from common.launcher import backend_pb2, chat
from common.mlx_utils import truncate_at_stop

pytestmark = pytest.mark.e2e

Q = "What is the capital of France?"


def stream_text(stub, opts):
    chunks = list(stub.PredictStream(opts, timeout=120))
    return b"".join(c.message for c in chunks).decode(), chunks


@pytest.fixture(scope="module")
def baseline(server):
    """Greedy answer to a question that yields a long sentence, with no stops."""
    reply = server.stub.Predict(chat("Describe Paris in three sentences.", Tokens=48), timeout=120)
    return reply.message.decode()


def test_greedy_chat_says_paris(stub):
    reply = stub.Predict(chat(Q, Tokens=32), timeout=120)
    assert "Paris" in reply.message.decode()
    assert reply.chat_deltas[0].content == reply.message.decode()
    assert reply.prompt_tokens > 10 and 0 < reply.tokens <= 32
    assert reply.timing_prompt_processing > 0 and reply.timing_token_generation > 0


def test_stream_equals_unary(stub):
    opts = chat(Q, Tokens=32)
    unary = stub.Predict(opts, timeout=120)
    text, chunks = stream_text(stub, opts)
    assert text == unary.message.decode()
    assert chunks[-1].tokens == unary.tokens
    assert chunks[-1].prompt_tokens == unary.prompt_tokens
    # Running totals: never decreasing, every chunk's delta mirrored in chat_deltas.
    counts = [c.tokens for c in chunks]
    assert counts == sorted(counts)
    for c in chunks:
        assert "".join(d.content for d in c.chat_deltas) == c.message.decode()
        assert c.prompt_tokens == unary.prompt_tokens


def test_tokens_limit_is_honoured(stub, baseline):
    reply = stub.Predict(chat("Describe Paris in three sentences.", Tokens=5), timeout=120)
    assert reply.tokens == 5
    assert baseline.startswith(reply.message.decode())


@pytest.mark.parametrize("pick", ["single_token", "multi_token", "mid_token", "never"])
def test_stop_strings_never_leak(stub, baseline, pick):
    words = baseline.split()
    assert len(words) > 8, baseline
    stop = {
        "single_token": " " + words[3],
        "multi_token": " ".join(words[4:7]),
        "mid_token": baseline[len(baseline) // 2: len(baseline) // 2 + 5],
        "never": "qqzz-never",
    }[pick]
    opts = chat("Describe Paris in three sentences.", Tokens=48, StopPrompts=[stop])
    expected, _ = truncate_at_stop(baseline, [stop])
    text, chunks = stream_text(stub, opts)
    assert text == expected
    for c in chunks:
        assert stop not in c.message.decode()
    assert stub.Predict(opts, timeout=120).message.decode() == expected


def test_stream_chunks_are_whole_utf8(stub):
    text, chunks = stream_text(stub, chat("Write three French words with accents, like café, and one emoji.",
                                          Tokens=40))
    assert any(ord(ch) > 127 for ch in text), text
    for c in chunks:
        c.message.decode("utf-8")  # raises on a split character
        assert "\ufffd" not in c.message.decode()


def test_tokenize_string_equals_tokenizer(stub):
    from mlx_lm.tokenizer_utils import load as load_tokenizer
    from pathlib import Path

    from loaders.gguf_loader import gguf_to_mlx_dir
    from loaders.model_loader import embedded_default

    tok = load_tokenizer(Path(gguf_to_mlx_dir(embedded_default())))
    raw = stub.TokenizeString(backend_pb2.PredictOptions(Prompt="Hello 12345 world, café!"), timeout=30)
    assert list(raw.tokens) == tok.encode("Hello 12345 world, café!")
    assert raw.length == len(raw.tokens)
    rendered = stub.TokenizeString(chat(Q), timeout=30)
    expected = tok.apply_chat_template([{"role": "user", "content": Q}], add_generation_prompt=True)
    assert list(rendered.tokens) == list(expected)
    back = stub.Detokenize(backend_pb2.DetokenizeRequest(tokens=raw.tokens), timeout=30)
    assert back.content == "Hello 12345 world, café!"


def test_seeded_sampling_is_reproducible(stub):
    opts = chat("Tell me a short story about a cat.", Tokens=16, Temperature=1.0, Seed=1234)
    a = stub.Predict(opts, timeout=120).message
    b = stub.Predict(opts, timeout=120).message
    assert a == b


@pytest.mark.parametrize("field,value,code", [
    ("TopP", 2.0, grpc.StatusCode.INVALID_ARGUMENT),
    ("TopK", -1, grpc.StatusCode.INVALID_ARGUMENT),
    ("Temperature", -0.5, grpc.StatusCode.INVALID_ARGUMENT),
    ("Tokens", -3, grpc.StatusCode.INVALID_ARGUMENT),
    ("Tools", "{not json", grpc.StatusCode.INVALID_ARGUMENT),
])
def test_bad_fields_are_invalid_argument(stub, field, value, code):
    with pytest.raises(grpc.RpcError) as err:
        opts = chat(Q, Tokens=4)
        setattr(opts, field, value)
        stub.Predict(opts, timeout=30)
    assert err.value.code() == code
    assert field in err.value.details()
    assert stub.Health(backend_pb2.HealthMessage(), timeout=5).message == b"OK"


def test_empty_prompt_is_invalid_argument(stub):
    for call in (stub.Predict, lambda o, timeout: list(stub.PredictStream(o, timeout=timeout))):
        with pytest.raises(grpc.RpcError) as err:
            call(backend_pb2.PredictOptions(Tokens=4), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_health_answers_fast_while_streaming(stub):
    """Health is answered between decode steps, not after them: its latency is compared with
    the time between two tokens of the stream in the same window, not with a fixed number
    of milliseconds (this machine is shared; both stretch alike when it is busy)."""
    done, arrivals = threading.Event(), []

    def long_stream():
        try:
            for _ in stub.PredictStream(chat("Write a long essay about the sea.", Tokens=60, IgnoreEOS=True),
                                        timeout=120):
                arrivals.append(time.perf_counter())
        finally:
            done.set()

    t = threading.Thread(target=long_stream)
    t.start()
    while not arrivals and not done.is_set():  # decoding from here on
        time.sleep(0.01)
    latencies = []
    while not done.is_set() and len(latencies) < 200:
        start = time.perf_counter()
        assert stub.Health(backend_pb2.HealthMessage(), timeout=5).message == b"OK"
        latencies.append(time.perf_counter() - start)
        time.sleep(0.01)
    t.join()
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert len(latencies) >= 10 and len(gaps) >= 30
    # A blocked event loop would make a Health call wait out most of a decode step.
    assert statistics.median(latencies) < statistics.median(gaps) / 2, (latencies, gaps)


def test_cancelled_stream_frees_its_slot(stub):
    generated = stub.GetMetrics(backend_pb2.MetricsRequest(), timeout=5).tokens_generated
    call = stub.PredictStream(chat("Write a long essay about the sea.", Tokens=200, IgnoreEOS=True), timeout=120)
    for i, _ in enumerate(call):
        if i == 2:
            call.cancel()
            break
    assert stub.Health(backend_pb2.HealthMessage(), timeout=5).message == b"OK"
    first = next(iter(stub.PredictStream(chat(Q, Tokens=8), timeout=60)))
    assert first.message
    deadline = time.monotonic() + 60  # a liveness bound only
    while stub.Status(backend_pb2.HealthMessage(), timeout=5).state != backend_pb2.StatusResponse.READY:
        assert time.monotonic() < deadline, "the cancelled request never left the batch"
        time.sleep(0.1)
    # Counted, not timed: the cancelled request left after a few of its 200 tokens.
    generated = stub.GetMetrics(backend_pb2.MetricsRequest(), timeout=5).tokens_generated - generated
    assert generated < 100, f"{generated} tokens generated: the cancelled request kept decoding"


def test_status_and_metrics(stub):
    status = stub.Status(backend_pb2.HealthMessage(), timeout=5)
    assert status.state in (backend_pb2.StatusResponse.READY, backend_pb2.StatusResponse.BUSY)
    assert status.memory.total > 10_000_000  # the model's weights at least
    metrics = stub.GetMetrics(backend_pb2.MetricsRequest(), timeout=5)
    assert metrics.tokens_generated > 0 and metrics.prompt_tokens_processed > 0
