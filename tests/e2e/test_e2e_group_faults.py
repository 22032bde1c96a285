"""End-to-end: what a group of ranks does when one of them fails, in tensor and in pipeline mode.

A tiny qwen2 (mlx-lm divides it both ways) over 2 ranks on loopback, a group started for each
fault. Each fault ends with the documented outcome (docs/multi-host.md), never a hang: the
stream fails UNAVAILABLE naming the rank within the rank timeout, every rank exits, and the
gRPC port is free again.
"""

import os
import signal
import socket
import time

import grpc
import pytest

from common.launcher import backend_pb2
from dist_support import RankGroup, greedy, tiny_llama_dir

pytestmark = pytest.mark.e2e

RANK_TIMEOUT = 6
ENV = {"MLX_BACKEND_FAULT_INJECTION": "1", "MLX_BACKEND_RANK_TIMEOUT": str(RANK_TIMEOUT)}
MODES = ("tensor", "pipeline")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_llama_dir(tmp_path_factory.mktemp("group-faults") / "qwen2", family="qwen2")


def started(model, log_dir, mode: str, name: str) -> RankGroup:
    g = RankGroup(2, log_dir, env=ENV, log_name=f"faults-{name}-{mode}")
    g.wait_healthy(180)
    result = g.load(model, Options=[f"parallel:{mode}"])
    assert result.success, result.message
    figures = g.stub.Status(backend_pb2.HealthMessage(), timeout=10).memory.breakdown
    assert figures[f"parallel_{mode}"] == 1, dict(figures)
    return g


def port_free(addr: str) -> bool:
    host, port = addr.rsplit(":", 1)
    try:
        with socket.create_server((host, int(port))):
            return True
    except OSError:
        return False


def fails_unavailable_naming(g: RankGroup, stream, rank: int, within: float) -> None:
    started_at = time.monotonic()
    with pytest.raises(grpc.RpcError) as e:
        for _ in stream:
            pass
    assert time.monotonic() - started_at < within, "the stream outlived the bound"
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value
    assert f"rank {rank}" in e.value.details(), e.value.details()


def streaming(g: RankGroup):
    """A long greedy stream, its first token already here."""
    stream = g.stub.PredictStream(greedy("Count with me:", 1800), timeout=120)
    next(stream)
    return stream


def all_gone(g: RankGroup) -> None:
    assert g.wait_all_exited(30), [p.poll() for p in g.procs]
    assert g.proc.returncode not in (0, None)
    assert port_free(g.addr)


@pytest.mark.parametrize("mode", MODES)
def test_a_follower_killed_mid_stream(model, log_dir, mode):
    g = started(model, log_dir, mode, "kill")
    try:
        stream = streaming(g)
        os.kill(g.followers[0].pid, signal.SIGKILL)
        fails_unavailable_naming(g, stream, 1, 30)
        all_gone(g)
    finally:
        g.stop()


@pytest.mark.parametrize("mode", MODES)
def test_a_follower_that_stalls(model, log_dir, mode):
    g = started(model, log_dir, mode, "stall")
    try:
        stream = streaming(g)
        os.kill(g.followers[0].pid, signal.SIGSTOP)  # alive, its sockets open, silent
        fails_unavailable_naming(g, stream, 1, RANK_TIMEOUT + 30)
        deadline = time.monotonic() + 30
        while g.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert g.proc.returncode not in (0, None)
        os.kill(g.followers[0].pid, signal.SIGCONT)  # woken, it finds rank 0 gone and ends
        all_gone(g)
    finally:
        g.stop()


@pytest.mark.parametrize("mode", MODES)
def test_rank0_killed_mid_stream(model, log_dir, mode):
    g = started(model, log_dir, mode, "kill0")
    try:
        stream = streaming(g)
        os.kill(g.proc.pid, signal.SIGKILL)
        with pytest.raises(grpc.RpcError) as e:  # the host sees the connection go
            for _ in stream:
                pass
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        started_at = time.monotonic()
        assert g.wait_all_exited(RANK_TIMEOUT + 30), "the follower outlived rank 0"
        assert time.monotonic() - started_at < RANK_TIMEOUT + 30
        assert g.followers[0].returncode == 3  # EXIT_GROUP_LOST
        assert port_free(g.addr)
    finally:
        g.stop()


def test_a_rank_with_a_wrong_secret_ends_and_the_group_never_serves(log_dir):
    """The control channel authenticates every rank: a follower started with another secret is
    dropped by rank 0 and ends at once, saying why; rank 0, missing a rank, never opens its
    gRPC port and ends when the group's forming time (MLX_BACKEND_GROUP_CONNECT_TIMEOUT) is up.
    No model is loaded: the mode plays no part."""
    g = RankGroup(2, log_dir, env=dict(ENV, MLX_BACKEND_GROUP_CONNECT_TIMEOUT="12"), log_name="faults-secret",
                  rank_env={1: {"MLX_BACKEND_GROUP_SECRET": "not-the-group-secret"}})
    try:
        assert g.wait_all_exited(60), [p.poll() for p in g.procs]
        assert g.followers[0].returncode == 3
        follower_log = open(log_dir / "faults-secret-rank1.log", errors="replace").read()
        assert "is MLX_BACKEND_GROUP_SECRET the same on every rank?" in follower_log, follower_log[-2000:]
        rank0_log = open(g.log_path, errors="replace").read()
        assert "a frame failed authentication" in rank0_log, rank0_log[-2000:]
        assert "did not reach rank 0 within 12s" in rank0_log, rank0_log[-2000:]
        assert "serving on" not in rank0_log
        assert g.proc.returncode not in (0, None)
        assert port_free(g.addr)
    finally:
        g.stop()
