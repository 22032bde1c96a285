"""End-to-end: every request ends exactly once, loads never freeze streams, continuations are exact.

Paths no client input reaches are driven by the env-gated fault injector
(MLX_BACKEND_FAULT_INJECTION=1, Metadata `fault` / `grammar_fault_at_token`).
"""

import json
import os
import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.launcher import backend_pb2, chat
from conftest import run_threads, serving

pytestmark = pytest.mark.e2e

COUNT = "1, 2, 3, 4, 5, 6, 7, 8,"
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def faulty_opts(opts, **metadata):
    for k, v in metadata.items():
        opts.Metadata[k] = v
    return opts


def text_of(stub, opts):
    return b"".join(c.message for c in stub.PredictStream(opts, timeout=120))


# ---- exact continuations and tokenization (the shared server) -------------------


def test_raw_completion_keeps_the_first_tokens_leading_space(stub):
    opts = backend_pb2.PredictOptions(Prompt=COUNT, Tokens=6, Logprobs=1)
    reply = stub.Predict(opts, timeout=60)
    text = reply.message.decode()
    assert text.startswith(" 9"), repr(text)
    # Every byte of every generated token, and nothing else: the tokens' own bytes.
    generated = b"".join(bytes(e["bytes"]) for e in json.loads(reply.logprobs)["content"])
    assert reply.message == generated
    assert text_of(stub, opts) == reply.message


def test_tokenize_the_empty_prompt(stub):
    from transformers import AutoTokenizer

    from loaders.gguf_loader import gguf_to_mlx_dir
    from loaders.model_loader import embedded_default

    hf = AutoTokenizer.from_pretrained(str(gguf_to_mlx_dir(embedded_default())))
    reply = stub.TokenizeString(backend_pb2.PredictOptions(Prompt=""), timeout=30)
    assert list(reply.tokens) == hf("")["input_ids"]
    assert reply.length == len(reply.tokens)


# ---- failures confined to their request (fault injection) ------------------------


@pytest.fixture(scope="module")
def faulty(log_dir):
    yield from serving(log_dir / "hardening-faulty.log", env={"MLX_BACKEND_FAULT_INJECTION": "1"})


def test_a_request_failing_at_admission_fails_alone(faulty):
    stub = faulty.stub
    others = [chat(q, Tokens=24) for q in ("Name three rivers.", "Describe a cat.")]
    solo = [text_of(stub, o) for o in others]
    started = threading.Event()

    def streamer(opts):
        def run():
            out = []
            for c in stub.PredictStream(opts, timeout=120):
                out.append(c.message)
                started.set()
            return b"".join(out)
        return run

    def bad():
        assert started.wait(60)
        return stub.Predict(faulty_opts(chat("What is 2 + 2?", Tokens=8), fault="admit"), timeout=30)

    results = run_threads([streamer(o) for o in others] + [bad])
    assert isinstance(results[-1], grpc.RpcError), results[-1]
    assert results[-1].code() == grpc.StatusCode.INTERNAL
    assert "injected fault at admit" in results[-1].details()
    assert results[:2] == solo


def test_a_failure_keeping_the_prompt_cache_does_not_lose_the_reply(faulty):
    stub = faulty.stub
    opts = chat("Name a large ocean.", Tokens=12)
    solo = stub.Predict(opts, timeout=60)
    reply = stub.Predict(faulty_opts(chat("Name a large ocean.", Tokens=12), fault="cache"), timeout=30)
    assert reply.message == solo.message and reply.tokens == solo.tokens
    assert stub.Predict(chat("Name a small sea.", Tokens=4), timeout=60).tokens == 4


def test_a_failing_grammar_fails_its_request(faulty):
    stub = faulty.stub
    grammar = 'root ::= [a-z ]+ "."'
    good = chat("Describe the sea.", Tokens=16, Grammar=grammar)
    solo = stub.Predict(good, timeout=60).message
    bad = faulty_opts(chat("Describe the sky.", Tokens=16, Grammar=grammar), grammar_fault_at_token="3")
    results = run_threads([lambda: stub.Predict(bad, timeout=60), lambda: stub.Predict(good, timeout=60).message])
    assert isinstance(results[0], grpc.RpcError), f"unconstrained text returned: {results[0]}"
    assert results[0].code() == grpc.StatusCode.INTERNAL
    assert "grammar failed" in results[0].details()
    assert results[1] == solo


def test_a_fault_recurring_on_every_pass_neither_floods_the_log_nor_wedges(faulty):
    """The engine loop raising on 12 passes in a row: one traceback, a line at 2, 4 and 8 in a row
    with a growing pause, the requests it ran fail with INTERNAL, and the next request is served."""
    stub = faulty.stub
    before = os.path.getsize(faulty.log_path)
    with pytest.raises(grpc.RpcError) as err:
        stub.Predict(faulty_opts(chat("Hello", Tokens=8), fault="loop"), timeout=60)
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert stub.Predict(chat("Name a river.", Tokens=4), timeout=60).tokens == 4
    with open(faulty.log_path, "rb") as f:
        f.seek(before)
        log = f.read().decode(errors="replace")
    assert log.count("engine step failed") == 1 + 3  # with the traceback, then at 2, 4 and 8 in a row
    assert log.count("Traceback") == 1
    for n, pause in ((2, 1), (4, 4), (8, 64)):
        assert f"engine step failed {n} times in a row (injected fault in the engine loop); pausing {pause} ms" in log


# ---- loading while streams run ------------------------------------------------------


def stream_during(stub, opts, action):
    """Run `action` once a stream is under way; the chunk times, the stream's end and the action's span."""
    times, box, started = [], {}, threading.Event()

    def streamer():
        try:
            for c in stub.PredictStream(opts, timeout=300):
                times.append(time.monotonic())
                box.setdefault("chunks", []).append(c)
                if len(times) == 2:
                    started.set()
        except grpc.RpcError as e:
            box["error"] = e
        started.set()

    t = threading.Thread(target=streamer)
    t.start()
    assert started.wait(120)
    begin = time.monotonic()
    box["result"] = action()
    end = time.monotonic()
    t.join(300)
    during = [x for x in times if begin < x < end]
    return box, during


def test_a_failed_load_leaves_the_old_model_serving_untouched(faulty, tmp_path):
    stub = faulty.stub
    opts = chat("Write a long essay about forests.", Tokens=40, IgnoreEOS=True)
    solo = text_of(stub, opts)
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    box, _ = stream_during(stub, opts, lambda: faulty.load(str(bad)))
    assert not box["result"].success and "broken.gguf" in box["result"].message
    assert "error" not in box, box.get("error")
    assert b"".join(c.message for c in box["chunks"]) == solo
    assert box["chunks"][-1].tokens == 40


def test_streams_keep_flowing_while_a_model_loads(faulty):
    from loaders.model_loader import embedded_default

    stub = faulty.stub
    opts = chat("Write a long essay about deserts.", Tokens=400, IgnoreEOS=True)
    box, during = stream_during(stub, opts, lambda: faulty.load(embedded_default()))
    assert box["result"].success, box["result"].message
    # Tokens kept arriving while the new model loaded (~3 s here); the swap then ends the stream.
    assert len(during) >= 3, f"only {len(during)} chunks arrived during the load"
    assert box["error"].code() == grpc.StatusCode.ABORTED
    assert stub.Predict(chat("Say hi.", Tokens=4), timeout=60).tokens == 4


def test_free_before_load_frees_the_old_model_first(faulty):
    stub = faulty.stub
    opts = chat("Write a long essay about valleys.", Tokens=400, IgnoreEOS=True)
    box, during = stream_during(stub, opts, lambda: faulty.load("", Options=["free_before_load:true"]))
    assert box["result"].success, box["result"].message
    assert box["error"].code() == grpc.StatusCode.ABORTED
    assert len(during) <= 1  # freed at once, not at the end of the load
    assert stub.Predict(chat("Say hi.", Tokens=4), timeout=60).tokens == 4


# ---- a dead engine ------------------------------------------------------------------


def standard_health(channel):
    """grpc.health.v1's status for the whole server, once it stops changing (it is set from the loop)."""
    stub = health_pb2_grpc.HealthStub(channel)
    status = None
    for _ in range(50):
        status = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
        if status == health_pb2.HealthCheckResponse.NOT_SERVING:
            break
        time.sleep(0.1)
    return status


def test_a_dead_engine_is_reported_and_fails_requests_fast(log_dir):
    gen = serving(log_dir / "hardening-dead.log", env={"MLX_BACKEND_FAULT_INJECTION": "1"})
    backend = next(gen)
    try:
        stub = backend.stub
        opts = chat("Write a long essay about glaciers.", Tokens=300, IgnoreEOS=True)
        box, _ = stream_during(stub, opts, lambda: run_threads([lambda: stub.Predict(
            faulty_opts(chat("Hello", Tokens=4), fault="engine"), timeout=30)])[0])
        # The request that killed it and the stream that was running both end, neither hangs.
        assert isinstance(box["result"], grpc.RpcError) and box["result"].code() == UNAVAILABLE
        assert box["error"].code() == UNAVAILABLE and "engine" in box["error"].details()
        with pytest.raises(grpc.RpcError) as err:
            stub.Health(backend_pb2.HealthMessage(), timeout=5)
        assert err.value.code() == UNAVAILABLE
        assert stub.Status(backend_pb2.HealthMessage(), timeout=5).state == backend_pb2.StatusResponse.ERROR
        assert standard_health(backend.channel) == health_pb2.HealthCheckResponse.NOT_SERVING
        for call in (stub.Predict, lambda o, timeout: list(stub.PredictStream(o, timeout=timeout))):
            with pytest.raises(grpc.RpcError) as err:
                call(chat("Hello", Tokens=4), timeout=10)
            assert err.value.code() == UNAVAILABLE  # at once, not at the deadline
        log = Path(backend.log_path).read_text()
        assert "engine thread died" in log
    finally:
        gen.close()


def test_first_token_alone_equals_the_batched_path(stub):
    """Alone, a request's first token comes from a direct prefill; it must match the batch's."""
    opts = backend_pb2.PredictOptions(Prompt=COUNT, Tokens=8, Logprobs=1, TopLogprobs=2)
    alone = stub.Predict(opts, timeout=60)
    one = stub.Predict(backend_pb2.PredictOptions(Prompt=COUNT, Tokens=1, Logprobs=1), timeout=60)
    assert one.tokens == 1 and alone.message.startswith(one.message)
    # Joining a running stream, the same request takes the batch generator's path for its first token.
    box, _ = stream_during(stub, chat("Write a long essay about birds.", Tokens=60),
                           lambda: stub.Predict(opts, timeout=60))
    together = box["result"]
    assert together.message == alone.message
    first_alone = json.loads(alone.logprobs)["content"][0]
    first_together = json.loads(together.logprobs)["content"][0]
    assert first_alone["id"] == first_together["id"]
    assert abs(first_alone["logprob"] - first_together["logprob"]) < 1e-3
