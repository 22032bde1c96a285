"""End-to-end: authentication, parent watch and graceful shutdown of the real process.

Each test starts its own backend (they end it) and bounds every RPC and wait.
"""

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest

from common.launcher import (BACKEND_DIR, START_S, Backend, backend_pb2, backend_pb2_grpc, chat,
                             free_port)

pytestmark = pytest.mark.e2e

TOKEN = "e2e-guard-token-1b7f"
BACKEND_PY = os.path.join(BACKEND_DIR, "backend.py")
# Pin what the runner's environment might set, so each test sees what it asks for.
BASE_ENV = {"LOCALAI_GRPC_AUTH_TOKEN": "", "LOCALAI_BACKEND_PARENT_WATCH": "true",
            "LOCALAI_BACKEND_PARENT_WATCH_INTERVAL": "200ms"}


def bearer(token):
    return [("authorization", f"Bearer {token}")]


def health(stub, metadata=None):
    return stub.Health(backend_pb2.HealthMessage(), timeout=5, metadata=metadata)


def wait_serving(stub, metadata=None, proc=None, timeout=START_S):
    """Poll Health (with `metadata`) until it answers OK."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"backend exited with {proc.returncode}")
        try:
            if health(stub, metadata).message == b"OK":
                return
        except grpc.RpcError:
            time.sleep(0.2)
    raise TimeoutError(f"backend not serving after {timeout}s")


def read_log(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


def process_gone(pid):
    """True once `pid` has exited (a zombie counts: our tests are not its parent)."""
    if os.path.isdir("/proc"):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        return state in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def wait_gone(pid, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process_gone(pid):
            return True
        time.sleep(0.1)
    return process_gone(pid)


# ---- authentication -----------------------------------------------------------

@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    log_path = str(tmp_path_factory.mktemp("guard") / "auth.log")
    backend = Backend(env=dict(BASE_ENV, LOCALAI_GRPC_AUTH_TOKEN=TOKEN), log_path=log_path)
    try:
        wait_serving(backend.raw_stub, bearer(TOKEN), backend.proc)
        yield backend
    finally:
        backend.stop()


def assert_unauthenticated(call):
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert TOKEN not in (err.value.details() or "")
    return err.value.details()


@pytest.mark.parametrize("metadata", [None, bearer("wrong-token"), [("authorization", TOKEN)]],
                         ids=["no-header", "wrong-token", "no-scheme"])
def test_auth_on_refuses_every_rpc_without_the_token(guarded, metadata):
    stub = guarded.raw_stub
    details = assert_unauthenticated(lambda: health(stub, metadata))
    assert "bearer" in details.lower()
    assert_unauthenticated(lambda: stub.Status(backend_pb2.HealthMessage(), timeout=5, metadata=metadata))
    assert_unauthenticated(lambda: stub.LoadModel(backend_pb2.ModelOptions(Model=""), timeout=5,
                                                  metadata=metadata))
    # Server streaming: the refusal arrives as the stream's status.
    assert_unauthenticated(lambda: list(stub.PredictStream(chat("hi", Tokens=2), timeout=5,
                                                           metadata=metadata)))


def test_auth_on_right_token_passes(guarded):
    stub = guarded.raw_stub
    assert health(stub, bearer(TOKEN)).message == b"OK"
    assert stub.Status(backend_pb2.HealthMessage(), timeout=5, metadata=bearer(TOKEN)).state == \
        backend_pb2.StatusResponse.UNINITIALIZED
    # Authorized streams reach the servicer (which says no model is loaded: LoadModel
    # above was refused, so nothing was loaded).
    with pytest.raises(grpc.RpcError) as err:
        list(stub.PredictStream(chat("hi", Tokens=2), timeout=5, metadata=bearer(TOKEN)))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_auth_on_is_logged_without_the_token(guarded):
    log = read_log(guarded.log_path)
    assert "auth on" in log and "parent watch on" in log
    assert TOKEN not in log


def test_auth_off_health_needs_no_header(tmp_path):
    log_path = str(tmp_path / "open.log")
    backend = Backend(env=BASE_ENV, log_path=log_path)
    try:
        wait_serving(backend.stub, proc=backend.proc)
        assert health(backend.stub).message == b"OK"
        assert "auth off" in read_log(log_path)
    finally:
        backend.stop()


# ---- parent watch -------------------------------------------------------------

# A stand-in host: starts the backend, reports its pid, then idles until killed
# (the sleep bounds its life should the test fail to kill it).
HOST = """
import subprocess, sys, time
log = open(sys.argv[2], "ab")
child = subprocess.Popen([sys.executable, sys.argv[1], "--addr", sys.argv[3]],
                         stdout=log, stderr=subprocess.STDOUT)
print(child.pid, flush=True)
time.sleep(300)
"""


def start_under_host(env, log_path):
    """(host process, backend pid, stub) with the backend serving."""
    addr = f"127.0.0.1:{free_port()}"
    host = subprocess.Popen([sys.executable, "-c", HOST, BACKEND_PY, log_path, addr],
                            stdout=subprocess.PIPE, env=dict(os.environ, **env))
    ready, _, _ = select.select([host.stdout], [], [], 30)
    line = host.stdout.readline() if ready else b""
    if not line.strip():
        host.kill()
        host.wait(10)
        raise RuntimeError("the stand-in host did not report the backend pid")
    pid = int(line)
    channel = grpc.insecure_channel(addr)
    return host, pid, channel


def stop_all(host, pid, channel):
    channel.close()
    if host.poll() is None:
        host.kill()
    host.wait(10)
    if pid is not None and not process_gone(pid):
        os.kill(pid, signal.SIGKILL)
        wait_gone(pid, 10)


def test_backend_exits_when_its_parent_dies(tmp_path):
    log_path = str(tmp_path / "orphan.log")
    host, pid, channel = start_under_host(BASE_ENV, log_path)
    try:
        wait_serving(backend_pb2_grpc.BackendStub(channel))
        host.kill()  # SIGKILL: the host cannot stop its child itself
        host.wait(10)
        assert wait_gone(pid, 10), f"backend {pid} still running after its parent died"
        log = read_log(log_path)
        assert "every 0.2s" in log
        assert "is gone" in log and "stopped" in log
    finally:
        stop_all(host, pid, channel)


def test_backend_survives_its_parent_when_the_watch_is_off(tmp_path):
    log_path = str(tmp_path / "unwatched.log")
    host, pid, channel = start_under_host(dict(BASE_ENV, LOCALAI_BACKEND_PARENT_WATCH="Off"), log_path)
    try:
        stub = backend_pb2_grpc.BackendStub(channel)
        wait_serving(stub)
        host.kill()
        host.wait(10)
        time.sleep(1.5)  # 7 watch intervals, had it been on
        assert not process_gone(pid)
        assert health(stub).message == b"OK"
        assert "parent watch off" in read_log(log_path)
        os.kill(pid, signal.SIGTERM)
        assert wait_gone(pid, 15)
    finally:
        stop_all(host, pid, channel)


# ---- graceful shutdown ----------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_while_idle_exits_zero(tmp_path, sig):
    log_path = str(tmp_path / "idle.log")
    # A grace far past the host's kill at 15 s: an idle server that waited it out would miss that.
    backend = Backend(env={**BASE_ENV, "MLX_BACKEND_SHUTDOWN_GRACE": "60s"}, log_path=log_path)
    try:
        wait_serving(backend.stub, proc=backend.proc)
        backend.proc.send_signal(sig)
        assert backend.proc.wait(timeout=15) == 0  # idle: no need to wait out the grace
        log = read_log(log_path)
        assert f"received {sig.name}" in log and "stopped" in log
    finally:
        backend.stop()


def stream_in_thread(stub, request):
    """Consume a PredictStream in a thread; returns (first chunk event, result dict, thread)."""
    first, result = threading.Event(), {"chunks": [], "error": None}

    def consume():
        try:
            for reply in stub.PredictStream(request, timeout=120):
                result["chunks"].append(reply)
                first.set()
        except grpc.RpcError as e:
            result["error"] = e
        finally:
            first.set()

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    return first, result, thread


def sigterm_mid_stream(tmp_path, env, tokens, **fields):
    """Load the embedded model, SIGTERM after the first chunk; (stream result, exit code, log)."""
    log_path = str(tmp_path / "stream.log")
    backend = Backend(env=dict(BASE_ENV, **env), log_path=log_path)
    try:
        wait_serving(backend.stub, proc=backend.proc)
        loaded = backend.load("", timeout=180)
        assert loaded.success, loaded.message
        request = chat("Tell me a long story about a dragon.", Tokens=tokens, IgnoreEOS=True, Temperature=0,
                       **fields)
        first, result, thread = stream_in_thread(backend.stub, request)
        assert first.wait(60), "no first chunk"
        assert result["chunks"], f"stream failed before its first chunk: {result['error']}"
        backend.proc.send_signal(signal.SIGTERM)
        thread.join(60)
        assert not thread.is_alive()
        code = backend.proc.wait(timeout=60)
        return result, code, read_log(log_path)
    finally:
        backend.stop()


def test_sigterm_during_a_stream_lets_it_finish(tmp_path):
    # SIGTERM stops new RPCs, but a grace far longer than this short stream lets
    # the one in flight run to its end; then the process exits 0.
    tokens = 24
    result, code, log = sigterm_mid_stream(tmp_path, {"MLX_BACKEND_SHUTDOWN_GRACE": "60"}, tokens, Logprobs=1)
    assert result["error"] is None, result["error"]
    chunks = result["chunks"]
    last = chunks[-1]
    assert last.tokens == tokens and last.prompt_tokens > 0
    # Every generated token's text reached the client: the streamed text is the
    # concatenation of the bytes of all `tokens` tokens the last chunk reports.
    generated = json.loads(last.logprobs)["content"]
    assert len(generated) == tokens
    assert b"".join(c.message for c in chunks) == b"".join(bytes(e["bytes"]) for e in generated)
    assert code == 0
    # The stream was still running when the signal arrived: it ended after it.
    assert "received SIGTERM" in log and "in-flight requests get up to 60s" in log and "stopped" in log
    finished = log.find(f"length: prompt {last.prompt_tokens} tokens")
    assert log.index("received SIGTERM") < finished < log.index("stopped"), log


def test_sigterm_with_zero_grace_cancels_the_stream(tmp_path):
    # What happens: with grace 0 server.stop cancels the in-flight RPC at once; the
    # client saw UNAVAILABLE ("Cancelling all calls"; CANCELLED is accepted too), the
    # engine failed what was left, and the process exited 0 within ~0.2 s.
    result, code, log = sigterm_mid_stream(tmp_path, {"MLX_BACKEND_SHUTDOWN_GRACE": "0"}, tokens=2000)
    error = result["error"]
    assert error is not None, "a 2000-token stream finished inside a zero grace"
    assert error.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE), error
    assert code == 0
    assert "stopped" in log
