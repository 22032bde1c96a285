"""LocalAI's side of a backend folder, as its source does it (facts, not its code).

Start (pkg/model/process.go): the relative name `run.sh`, the backend folder as working
directory, argv `run.sh --addr 127.0.0.1:PORT`, stdin closed, output to files, its own process
group. Readiness: Health must answer "OK", tried 20 times 2 s apart. Stop: SIGTERM to the
group, SIGKILL 15 s later.
"""

import os
import signal
import subprocess
import time
from pathlib import Path

import grpc

from common.launcher import backend_pb2, backend_pb2_grpc, free_port

HEALTH_TRIES, HEALTH_PAUSE_S = 20, 2.0
KILL_AFTER_S = 15.0


def _close_stdin() -> None:
    os.close(0)


def start_like_localai(folder: Path, log_path: Path, env=None):
    """(process, channel, stub) of `folder`'s run.sh started as LocalAI starts it (the test's
    environment inherited, with a store root of its own unless `env` names one)."""
    from conftest import own_cache_root

    env = dict(os.environ if env is None else env)
    if env.get("MLX_BACKEND_CACHE_DIR") in (None, os.environ.get("MLX_BACKEND_CACHE_DIR")):
        env["MLX_BACKEND_CACHE_DIR"] = own_cache_root()  # not the run's own: a root of its own
    addr = f"127.0.0.1:{free_port()}"
    with open(log_path, "ab") as log:
        # executable "./run.sh" is resolved after the chdir into `folder`, as Go's StartProcess does.
        proc = subprocess.Popen(["run.sh", "--addr", addr], executable="./run.sh", cwd=folder, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_close_stdin)
    channel = grpc.insecure_channel(addr)
    return proc, channel, backend_pb2_grpc.BackendStub(channel)


def wait_healthy_like_the_host(stub, proc) -> None:
    """LocalAI polls Health up to 20 times, 2 s apart, until the message is exactly OK."""
    for _ in range(HEALTH_TRIES):
        assert proc.poll() is None, f"backend exited with {proc.returncode}"
        try:
            if stub.Health(backend_pb2.HealthMessage(), timeout=10).message == b"OK":
                return
        except grpc.RpcError:
            pass
        time.sleep(HEALTH_PAUSE_S)
    raise AssertionError("the backend never answered Health OK")


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def stop_like_localai(proc) -> bool:
    """SIGTERM to the process group; True when every process of it is gone before LocalAI's SIGKILL."""
    os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + KILL_AFTER_S
    while time.monotonic() < deadline:
        proc.poll()  # reap the leader, else it lingers as a zombie of the group
        if not group_alive(proc.pid):
            return True
        time.sleep(0.1)
    return False


def kill_group(proc) -> None:
    if proc.poll() is None or group_alive(proc.pid):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
