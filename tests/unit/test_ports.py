"""Two backends never share a port: the backend refuses a port already served (gRPC's default
would let it bind too and take half of the connections), and the launcher never hands the same
port to two processes (concurrent test runs)."""

import subprocess
import sys
import textwrap

import pytest

from common.launcher import BACKEND_DIR, EXIT_CANNOT_LISTEN, Backend, backend_pb2, free_port


@pytest.mark.e2e
def test_a_second_backend_on_a_served_port_exits_and_the_first_keeps_serving(tmp_path):
    with Backend(log_path=str(tmp_path / "first.log")) as first:
        second = subprocess.run([sys.executable, f"{BACKEND_DIR}/backend.py", "--addr", first.addr],
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == EXIT_CANNOT_LISTEN, second.stderr[-2000:]
        assert f"cannot listen on {first.addr}" in second.stderr
        for _ in range(20):  # every call reaches the first, none a half-started second
            assert first.stub.Health(backend_pb2.HealthMessage(), timeout=5).message == b"OK"


def test_concurrent_processes_are_never_handed_the_same_port():
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {BACKEND_DIR!r} + "/..")
        from common.launcher import free_port
        print(" ".join(str(free_port()) for _ in range(200)), flush=True)
        sys.stdin.read()  # hold the reservations until the test has compared
    """)
    children = [subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True) for _ in range(3)]
    try:
        mine = [free_port() for _ in range(200)]
        handed = [mine] + [[int(p) for p in c.stdout.readline().split()] for c in children]
    finally:
        for c in children:
            c.communicate("", timeout=30)
    every = [p for ports in handed for p in ports]
    assert all(len(ports) == 200 for ports in handed)
    assert len(set(every)) == len(every)
