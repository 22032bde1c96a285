"""Load options checked before loading, admission bounds and a truthful Health, through the real server."""

import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import backend_pb2
from common.launcher import chat
from conftest import serving

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def backend(log_dir):
    yield from serving(log_dir / "admission.log", env={"MLX_BACKEND_FAULT_INJECTION": "1"})


def load(backend, *options, **fields):
    result = backend.load("", Options=list(options), **fields)
    assert result.success, result.message


def refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value


def ordinary(stub):
    assert stub.Predict(chat("Name a river.", Tokens=3), timeout=120).tokens == 3


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not seen within {timeout}s: {what}")


def first_chunk(stub, opts):
    """A stream under way: the call (to cancel) once its first chunk arrived."""
    call = stub.PredictStream(opts, timeout=300)
    next(call)
    return call


# ---- load options ------------------------------------------------------------------


@pytest.mark.parametrize("options,fields,words", [
    (["forward_chunk_tokens:0"], {}, "forward_chunk_tokens: expected a whole number in [1, 1048576], got 0"),
    (["forward_chunk_tokens:-5"], {}, "forward_chunk_tokens: expected a whole number in [1, 1048576], got -5"),
    (["forward_chunk_tokens:abc"], {}, "forward_chunk_tokens: expected a whole number in [1, 1048576], got 'abc'"),
    (["max_sequences:100000"], {}, "max_sequences: expected a whole number in [1, 1024]"),
    (["health_timeout:0"], {}, "health_timeout: expected a number in [0.05, 86400]"),
    (["kv_budget_bytes:lots"], {}, "kv_budget_bytes: expected a whole number"),
    (["top_p:1.5"], {}, "top_p: expected a number in [0, 1]"),
    ([], {"ContextSize": -5}, "ContextSize: expected a whole number in [1, 16777216], got -5"),
    ([], {"DType": "int8"}, "DType: expected one of auto, float32"),
])
def test_a_bad_load_option_is_refused_by_name_and_the_server_still_serves(backend, options, fields, words):
    result = backend.load("", Options=options, **fields)
    assert not result.success and words in result.message, result.message
    emb = backend.stub.Embedding(backend_pb2.PredictOptions(Embeddings="a short text"), timeout=120)
    assert emb.dim > 0
    ordinary(backend.stub)


# ---- admission bounds ------------------------------------------------------------------


def test_past_max_waiting_a_request_is_refused_and_the_queued_one_runs(backend):
    load(backend, "max_sequences:1", "max_waiting:1")
    stub = backend.stub
    running = first_chunk(stub, chat("Tell me a long story.", Tokens=400, IgnoreEOS=True))
    calls = [stub.Predict.future(chat(q, Tokens=3), timeout=300) for q in ("Name a lake.", "Name a sea.")]
    first = wait_for(lambda: next((c for c in calls if c.done()), None), 120, "one call ends while the stream runs")
    assert first.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_waiting=1" in first.details()
    running.cancel()
    other = calls[1 - calls.index(first)]
    assert other.result().tokens == 3
    ordinary(stub)


def test_past_max_concurrent_rpcs_a_call_is_refused_and_health_answers(backend):
    load(backend, "max_concurrent_rpcs:2", "max_sequences:2")
    stub = backend.stub
    streams = [first_chunk(stub, chat(q, Tokens=400, IgnoreEOS=True)) for q in ("Tell a story.", "Tell a tale.")]
    for call in (lambda: stub.Predict(chat("Name a lake.", Tokens=3), timeout=60),
                 lambda: stub.Embedding(backend_pb2.PredictOptions(Embeddings="text"), timeout=60)):
        e = refused(call)
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_concurrent_rpcs=2" in e.details()
    # Refused at once, not once a place came free: both 400-token streams are still running.
    assert not any(call.done() for call in streams), "refused only after the running streams ended"
    assert stub.Health(backend_pb2.HealthMessage(), timeout=10).message == b"OK"
    for call in streams:
        call.cancel()
    wait_for(lambda: _served(stub), 60, "an ordinary request served once the streams left")


def _served(stub) -> bool:
    try:
        ordinary(stub)
        return True
    except grpc.RpcError as e:  # the cancelled streams may not have left the gate yet
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
        return False


def test_kv_budget_refuses_what_never_fits_and_shortens_an_open_ended_request(backend):
    load(backend)
    stub = backend.stub
    per_token = stub.Status(backend_pb2.HealthMessage()).memory.breakdown["kv_bytes_per_token"]
    question = chat("Name a mountain.", Tokens=1)
    prompt = stub.Predict(question, timeout=120).prompt_tokens
    load(backend, f"kv_budget_bytes:{(prompt + 5) * per_token}")  # room for the prompt and 5 tokens
    e = refused(lambda: stub.Predict(chat("Name a mountain.", Tokens=6), timeout=60))
    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "kv_budget_bytes" in e.details()
    assert f"prompt {prompt} + max tokens 6" in e.details()
    # Without Tokens it runs to where the budget ends; two that fit only one at a time both run.
    assert stub.Predict(chat("Name a mountain.", IgnoreEOS=True), timeout=120).tokens == 5
    both = [stub.Predict.future(chat("Name a mountain.", Tokens=5, IgnoreEOS=True), timeout=300) for _ in range(2)]
    assert [c.result().tokens for c in both] == [5, 5]
    # With room for more, an open-ended request takes its share (budget / max_sequences), not
    # all of it: two such shares here, so two run side by side, each cut at its share.
    load(backend, f"kv_budget_bytes:{2 * (prompt + 5) * per_token}", "max_sequences:2")
    open_ended = [stub.Predict.future(chat("Name a mountain.", IgnoreEOS=True), timeout=300) for _ in range(2)]
    assert [c.result().tokens for c in open_ended] == [5, 5]


# ---- Health tells the truth ------------------------------------------------------------


def health_states(backend):
    """(Backend.Health answered OK, grpc.health.v1 says SERVING)."""
    try:
        ok = backend.stub.Health(backend_pb2.HealthMessage(), timeout=10).message == b"OK"
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.UNAVAILABLE and "health_timeout=0.5s" in e.details(), e
        ok = False
    status = health_pb2_grpc.HealthStub(backend.channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status
    return ok, status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("fault", ["failing", "stall"])
def test_health_turns_not_serving_while_the_engine_fails_or_is_stuck(backend, fault):
    """fault "failing": every engine pass fails for 5 s; "stall": one pass blocks 5 s. With
    health_timeout 0.5 s both Health RPCs turn not-serving, then serving again once it ends."""
    load(backend, "health_timeout:0.5")
    stub = backend.stub
    # The swap itself (a full collection) may take longer than 0.5 s on a loaded machine.
    wait_for(lambda: health_states(backend) == (True, True), 30, "serving after the load")
    opts = chat("Hello", Tokens=2)
    opts.Metadata["fault"] = fault
    call = stub.Predict.future(opts, timeout=120)
    wait_for(lambda: health_states(backend) == (False, False), 30, "Health and grpc health not serving")
    wait_for(lambda: health_states(backend) == (True, True), 60, "serving again once the fault ended")
    if fault == "stall":  # the failing passes may come after its two tokens, or fail it: either is right
        assert call.result().tokens == 2
    ordinary(stub)



def test_a_cancelled_stream_leaves_the_rpc_gate_while_the_engine_is_busy(backend):
    """The gate's place of a stream the client cancelled is free at once, not only when the
    engine next sends that stream something: here the engine is blocked for 5 s admitting it
    (fault "stall"); a call made after the cancel is let in while the stalled stream has not
    yet left the engine (its log line comes after the stall), waits in the queue and is served."""
    load(backend, "max_concurrent_rpcs:1", "health_timeout:0.5")
    stub = backend.stub
    wait_for(lambda: _served(stub), 60, "the first call after the load")
    wait_for(lambda: health_states(backend) == (True, True), 30, "serving after the load")
    opts = chat("Tell a story.", Tokens=5, CorrelationId="stalled-stream")
    opts.Metadata["fault"] = "stall"
    stalled = stub.PredictStream(opts, timeout=120)
    threading.Thread(target=_drain, args=(stalled,), daemon=True).start()
    wait_for(lambda: _refused_at_once(stub), 30, "the stalled stream holds the gate's one place")
    wait_for(lambda: health_states(backend) == (False, False), 30, "the engine inside the stalled admission")
    stalled.cancel()
    call = wait_for(lambda: _let_in(stub), 30, "a call let in after the cancel")
    assert "(stalled-stream)" not in _log(backend), "let in only once the stalled stream had left the engine"
    assert call.result().tokens == 3


def _drain(call) -> None:
    try:
        for _ in call:
            pass
    except grpc.RpcError:
        pass


def _refused_at_once(stub) -> bool:
    try:
        stub.Predict(chat("Name a lake.", Tokens=1), timeout=2)
    except grpc.RpcError as e:
        return e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    return False


def _let_in(stub):
    """A call that was not refused within 0.5 s (it waits in the engine), or None."""
    call = stub.Predict.future(chat("Name a river.", Tokens=3), timeout=120)
    time.sleep(0.5)
    if call.done() and call.exception() is not None and call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    return call


def _log(backend) -> str:
    with open(backend.log_path, encoding="utf-8", errors="replace") as f:
        return f.read()
