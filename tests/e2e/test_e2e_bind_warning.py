"""A backend listening beyond loopback without a token says so when it starts."""

import os
import subprocess
import sys
import time

import pytest

from common.launcher import BACKEND_DIR, free_port

pytestmark = pytest.mark.e2e


def _start_log(addr: str, log_path, env) -> str:
    """The backend's log up to its 'serving on' line."""
    with open(log_path, "ab") as out:
        proc = subprocess.Popen([sys.executable, os.path.join(BACKEND_DIR, "backend.py"), "--addr", addr],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while "serving on" not in open(log_path, errors="replace").read():
            assert proc.poll() is None and time.monotonic() < deadline, open(log_path, errors="replace").read()
            time.sleep(0.1)
        return open(log_path, errors="replace").read()
    finally:
        proc.terminate()
        proc.wait(30)


def test_an_open_bind_beyond_loopback_logs_a_warning_and_loopback_does_not(log_dir):
    env = {k: v for k, v in os.environ.items() if k != "LOCALAI_GRPC_AUTH_TOKEN"}
    exposed = _start_log(f"0.0.0.0:{free_port()}", log_dir / "bind-open.log", env)
    assert "WARNING" in exposed and "beyond loopback with no LOCALAI_GRPC_AUTH_TOKEN" in exposed
    local = _start_log(f"127.0.0.1:{free_port()}", log_dir / "bind-local.log", env)
    assert "beyond loopback" not in local
