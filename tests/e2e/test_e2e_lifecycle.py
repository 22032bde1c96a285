"""End-to-end: loading, freeing and failing to load, on a server of its own."""

import grpc
import pytest

from common.launcher import Backend, backend_pb2, chat

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def fresh(log_dir):
    backend = Backend(log_path=str(log_dir / "lifecycle.log"))
    backend.wait_healthy()
    yield backend
    backend.stop()


def predict(stub, **kw):
    return stub.Predict(chat("What is the capital of France?", Tokens=8, **kw), timeout=120)


def test_predict_before_load_is_failed_precondition(log_dir):
    with Backend(log_path=str(log_dir / "lifecycle-unloaded.log")) as unloaded:  # the others load models
        with pytest.raises(grpc.RpcError) as err:
            predict(unloaded.stub)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "model not loaded" in err.value.details()
        assert unloaded.stub.Status(backend_pb2.HealthMessage(), timeout=5).state == \
            backend_pb2.StatusResponse.UNINITIALIZED


def test_missing_model_fails_and_server_keeps_serving(fresh, tmp_path):
    result = fresh.load(str(tmp_path / "no-such-model.gguf"))
    assert not result.success
    assert "not found" in result.message
    assert fresh.stub.Health(backend_pb2.HealthMessage(), timeout=5).message == b"OK"


def test_hub_id_offline_fails_clearly(fresh):
    # Answered within the call's own deadline (a hung download would end DEADLINE_EXCEEDED).
    result = fresh.load("mlx-community/definitely-not-here-4bit", timeout=120)
    assert not result.success
    assert "definitely-not-here" in result.message


def test_load_free_reload(fresh):
    loaded = fresh.load("")
    assert loaded.success and loaded.message == "MLX model loaded successfully"  # LocalAI's wording
    assert "Paris" in predict(fresh.stub).message.decode()
    assert fresh.stub.Free(backend_pb2.HealthMessage(), timeout=30).success
    with pytest.raises(grpc.RpcError) as err:
        predict(fresh.stub)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.RpcError) as err:
        fresh.stub.TokenizeString(backend_pb2.PredictOptions(Prompt="hi"), timeout=5)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert fresh.load("").success
    assert "Paris" in predict(fresh.stub).message.decode()


def test_model_resolved_against_model_path(fresh):
    from loaders.model_loader import embedded_default
    import os

    path = embedded_default()
    result = fresh.load(os.path.basename(path), ModelPath=os.path.dirname(path))
    assert result.success, result.message


def test_prompt_longer_than_context_is_resource_exhausted(fresh):
    assert fresh.load("", ContextSize=64).success
    with pytest.raises(grpc.RpcError) as err:
        fresh.stub.Predict(backend_pb2.PredictOptions(Prompt="word " * 200, Tokens=4), timeout=60)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # Tokens 0 runs until the context is full, not forever.
    reply = fresh.stub.Predict(backend_pb2.PredictOptions(Prompt="Count: 1, 2, 3,", IgnoreEOS=True), timeout=120)
    assert reply.prompt_tokens + reply.tokens <= 64
    assert predict(fresh.stub).message


def test_bad_option_fails_load_with_message(fresh):
    result = fresh.load("", Options=["max_sequences:zero"])
    assert not result.success
    assert "max_sequences" in result.message


def test_model_identity_mismatch(fresh):
    assert fresh.load("").success  # loaded name is "" here: identity check is skipped
    predict(fresh.stub, ModelIdentity="anything")
    from loaders.model_loader import embedded_default

    assert fresh.load(embedded_default()).success
    with pytest.raises(grpc.RpcError) as err:
        predict(fresh.stub, ModelIdentity="other-model")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "model identity mismatch" in err.value.details()
    assert predict(fresh.stub, ModelIdentity=embedded_default()).message
