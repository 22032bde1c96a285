"""Start a backend process the way a host does, and wait until it is healthy.

Used by the smoke run, the demo, the end-to-end tests and the benchmark.
"""

import fcntl
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKEND_DIR = os.path.join(REPO, "backend")
for _p in (BACKEND_DIR, REPO):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import grpc  # noqa: E402

import backend_pb2  # noqa: E402
import backend_pb2_grpc  # noqa: E402


EXIT_CANNOT_LISTEN = 98  # backend.py's exit code when its --addr cannot be bound
# How long to wait for a started backend to answer Health: a liveness bound, not a speed (a loaded
# 2-core machine took 30-70 s from spawn to Health); a quick start or an exit ends the wait at once.
START_S = 300.0
_reserved = []  # lock files of the ports this process handed out, held until it exits


def free_port() -> int:
    """A loopback port no other process is listening on, and that no other process using this
    function (a concurrent test run, another checkout's) has been handed: between this
    choice and the backend's bind the kernel could give the same free port to both."""
    folder = os.path.join(tempfile.gettempdir(), f"mlx-backend-ports-{os.getuid()}")
    os.makedirs(folder, exist_ok=True)
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        lock = open(os.path.join(folder, f"{port}.lock"), "a")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # reserved by a live process
            lock.close()
            continue
        if any(held.name == lock.name for held in _reserved):  # handed out here already
            lock.close()
            continue
        _reserved.append(lock)
        return port


class _Bearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
              grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Sends `authorization: Bearer <token>` as the host does when auth is on."""

    def __init__(self, token: str):
        self.header = ("authorization", f"Bearer {token}")

    def _with_header(self, details):
        return details._replace(metadata=list(details.metadata or []) + [self.header])

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_header(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_header(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._with_header(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._with_header(details), requests)


class Backend:
    """A running backend process and a gRPC stub to it."""

    def __init__(self, env: Optional[Dict[str, str]] = None, log_path: Optional[str] = None,
                 python: str = sys.executable):
        self.env, self.log_path, self.python = env, log_path, python
        self.binds = 0
        self._spawn()

    def _spawn(self) -> None:
        self.binds += 1
        self.addr = f"127.0.0.1:{free_port()}"
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [self.python, os.path.join(BACKEND_DIR, "backend.py"), "--addr", self.addr],
            env=dict(os.environ, **(self.env or {})), stdout=out, stderr=subprocess.STDOUT)
        self.channel = grpc.insecure_channel(self.addr)
        token = (self.env or {}).get("LOCALAI_GRPC_AUTH_TOKEN", os.environ.get("LOCALAI_GRPC_AUTH_TOKEN", ""))
        channel = grpc.intercept_channel(self.channel, _Bearer(token)) if token else self.channel
        self.stub = backend_pb2_grpc.BackendStub(channel)
        self.raw_stub = backend_pb2_grpc.BackendStub(self.channel)  # sends no credentials

    def wait_healthy(self, timeout: float = START_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                # Another program took the port between our choice and the bind: a new one.
                if self.proc.returncode == EXIT_CANNOT_LISTEN and self.binds < 3:
                    self.channel.close()
                    self._spawn()
                    continue
                raise RuntimeError(f"backend exited with {self.proc.returncode} (log: {self.log_path})")
            try:
                if self.stub.Health(backend_pb2.HealthMessage(), timeout=2).message == b"OK":
                    return
            except grpc.RpcError:
                time.sleep(0.2)
        raise TimeoutError(f"backend at {self.addr} not healthy after {timeout}s")

    def load(self, model: str = "", timeout: float = 600.0, **fields) -> "backend_pb2.Result":
        return self.stub.LoadModel(backend_pb2.ModelOptions(Model=model, **fields), timeout=timeout)

    def stop(self, timeout: float = 15.0) -> int:
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self):
        self.wait_healthy()
        return self

    def __exit__(self, *exc):
        self.stop()


def chat(question: str, **fields) -> "backend_pb2.PredictOptions":
    """A PredictOptions for one user message through the model's chat template."""
    return backend_pb2.PredictOptions(
        Messages=[backend_pb2.Message(role="user", content=question)],
        UseTokenizerTemplate=True, **fields)
