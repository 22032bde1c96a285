"""End-to-end: LocalAI's way of starting a backend folder, the model YAML of docs/localai.md, standard gRPC services."""

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

import localai_backend
from common import launcher
from common.launcher import REPO, Backend, backend_pb2, chat
from localai_host import start_like_localai, wait_healthy_like_the_host

pytestmark = pytest.mark.e2e

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
TOKEN = "s3cret-token"
SERVING = health_pb2.HealthCheckResponse.SERVING
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED


@pytest.fixture(scope="module")
def models_folder(tmp_path_factory):
    """A LocalAI models folder holding what the examples in docs/localai.md name."""
    from loaders.model_loader import embedded_default
    from models import thinking_model_dir

    folder = tmp_path_factory.mktemp("models")
    os.symlink(embedded_default(), folder / GGUF_NAME)
    os.symlink(thinking_model_dir(), folder / "smollm2-thinking")
    return folder


def test_backend_folder_runs_as_localai_starts_it(tmp_path, models_folder, log_dir):
    folder = localai_backend.layout(str(tmp_path / "backends"))
    assert json.loads((folder / "metadata.json").read_text())["name"] == "mlx"
    again = localai_backend.layout(str(tmp_path / "backends"), alias="mlx-apple")  # updated in place
    assert again == folder and sorted(os.listdir(folder)) == ["metadata.json", "run.sh"]
    assert json.loads((folder / "metadata.json").read_text())["alias"] == "mlx-apple"
    assert os.access(folder / "run.sh", os.X_OK)

    proc, channel, stub = start_like_localai(folder, log_dir / "localai-folder.log")
    try:
        wait_healthy_like_the_host(stub, proc)
        if os.path.isdir(f"/proc/{proc.pid}/fd"):  # the stdin the host closed is /dev/null, not a reused number
            assert os.readlink(f"/proc/{proc.pid}/fd/0") == os.devnull
        result = stub.LoadModel(backend_pb2.ModelOptions(
            Model=GGUF_NAME, ModelFile=str(models_folder / GGUF_NAME), ModelPath=str(models_folder),
            ContextSize=4096), timeout=300)
        assert result.success, result.message
        chunks = list(stub.PredictStream(chat("What is the capital of France?", Tokens=8,
                                              ModelIdentity=GGUF_NAME), timeout=120))
        assert 0 < chunks[-1].tokens <= 8 and b"Paris" in b"".join(c.message for c in chunks)
        assert stub.Free(backend_pb2.HealthMessage(), timeout=5).success
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        channel.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_sigterm_mid_stream_exits_before_the_hosts_kill_deadline(tmp_path, log_dir):
    """LocalAI sends SIGKILL 15 s after SIGTERM: with the default grace we are gone well before."""
    folder = localai_backend.layout(str(tmp_path / "backends"))
    proc, channel, stub = start_like_localai(folder, log_dir / "localai-deadline.log")
    try:
        wait_healthy_like_the_host(stub, proc)
        assert stub.LoadModel(backend_pb2.ModelOptions(Model=""), timeout=300).success
        first, errors = threading.Event(), []

        def stream():
            try:
                for _ in stub.PredictStream(chat("Write a very long story.", Tokens=4000, IgnoreEOS=True),
                                            timeout=120):
                    first.set()
            except grpc.RpcError as e:
                errors.append(e)
            first.set()

        t = threading.Thread(target=stream)
        t.start()
        assert first.wait(60)
        signalled = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(30) == 0
        assert time.monotonic() - signalled < 14.0
        t.join(30)
        assert errors and errors[0].code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
    finally:
        channel.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# ---- docs/localai.md's model YAML, as the host turns it into requests -----------


def readme_examples():
    text = (Path(REPO) / "docs" / "localai.md").read_text()
    section = text.split("# Use it from LocalAI", 1)[1].split("\n## ", 1)[0]
    return [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", section, re.S)]


def host_load_options(cfg, models: Path) -> "backend_pb2.ModelOptions":
    """ModelOptions as LocalAI builds them from a model config (facts from its source)."""
    model = cfg["parameters"]["model"]
    return backend_pb2.ModelOptions(
        Model=model, ModelFile=str(models / model), ModelPath=str(models),
        ContextSize=cfg.get("context_size", 4096), Options=cfg.get("options", []),
        DType=cfg.get("dtype", ""), TrustRemoteCode=bool(cfg.get("trust_remote_code", False)),
        Seed=1234, NBatch=512, Threads=1, NGPULayers=9999999, FlashAttention="auto")


def host_predict_options(cfg, question: str) -> "backend_pb2.PredictOptions":
    params = cfg.get("parameters", {})
    opts = backend_pb2.PredictOptions(
        Temperature=params.get("temperature", 0.9), TopP=params.get("top_p", 0.95), TopK=params.get("top_k", 0),
        Tokens=params.get("max_tokens", 12), Seed=4321, TypicalP=1.0, TailFreeSamplingZ=1.0,
        MirostatETA=0.1, MirostatTAU=5.0, StopPrompts=cfg.get("stopwords", []),
        UseTokenizerTemplate=bool(cfg.get("template", {}).get("use_tokenizer_template")),
        Messages=[backend_pb2.Message(role="user", content=question)], ModelIdentity=cfg["parameters"]["model"])
    if "reasoning" in cfg and "disable" in cfg["reasoning"]:
        opts.Metadata["enable_thinking"] = "false" if cfg["reasoning"]["disable"] else "true"
    return opts


def test_readme_model_yaml_loads_and_answers(models_folder, log_dir):
    examples = readme_examples()
    assert len(examples) == 2, "the LocalAI examples in docs/localai.md changed: update this test"
    with Backend(log_path=str(log_dir / "localai-yaml.log")) as backend:
        for cfg in examples:
            assert cfg["backend"] == "mlx"
            result = backend.stub.LoadModel(host_load_options(cfg, models_folder), timeout=300)
            assert result.success, (cfg["name"], result.message)
            reply = backend.stub.Predict(host_predict_options(cfg, "Name three colors."), timeout=120)
            assert reply.tokens > 0 and reply.chat_deltas[0].content, cfg["name"]
            status = backend.stub.Status(backend_pb2.HealthMessage(), timeout=5)
            assert status.state in (backend_pb2.StatusResponse.READY, backend_pb2.StatusResponse.BUSY)


# ---- grpc.health.v1 and reflection ----------------------------------------------


def health_check(channel, service=""):
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)


def listed_services(channel):
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    answers = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
    return sorted(s.name for a in answers for s in a.list_services_response.service)


@pytest.fixture(scope="module")
def authed(log_dir):
    with Backend(env={"LOCALAI_GRPC_AUTH_TOKEN": TOKEN}, log_path=str(log_dir / "localai-authed.log")) as b:
        yield b


def test_standard_health_and_reflection_with_the_token(authed):
    channel = grpc.intercept_channel(authed.channel, launcher._Bearer(TOKEN))
    for service in ("", "backend.Backend"):
        assert health_check(channel, service).status == SERVING
    with pytest.raises(grpc.RpcError) as err:
        health_check(channel, "no.such.Service")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert next(watch).status == SERVING
    watch.cancel()
    assert {"backend.Backend", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= \
        set(listed_services(channel))


def test_standard_services_refuse_callers_without_the_token(authed):
    for call in (lambda: health_check(authed.channel), lambda: listed_services(authed.channel)):
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == UNAUTHENTICATED


def test_health_open_leaves_only_the_health_service_open(log_dir):
    env = {"LOCALAI_GRPC_AUTH_TOKEN": TOKEN, "MLX_BACKEND_HEALTH_OPEN": "1"}
    with Backend(env=env, log_path=str(log_dir / "localai-health-open.log")) as b:
        assert health_check(b.channel).status == SERVING
        for call in (lambda: listed_services(b.channel),
                     lambda: b.raw_stub.Health(backend_pb2.HealthMessage(), timeout=5)):
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == UNAUTHENTICATED
