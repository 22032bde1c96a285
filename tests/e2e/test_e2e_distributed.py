"""End-to-end: one model over two ranks (ring backend, loopback), against one process.

A random-weight llama (4 heads, 2 KV heads) built here is split over 2 ranks;
every answer is compared with the same model in one ordinary backend process:
the same tokens, logprobs equal up to summation order (the tensor-parallel
all_sum adds the halves in another order than one matmul does).
"""

import json
import os
import signal
import socket
import time

import grpc
import pytest

from common.launcher import Backend, backend_pb2, chat, free_port
from conftest import run_threads
from dist_support import RankGroup, greedy, tiny_llama_dir

pytestmark = pytest.mark.e2e

ENV = {"MLX_BACKEND_FAULT_INJECTION": "1", "MLX_BACKEND_RANK_TIMEOUT": "10"}
LOGPROB_TOL = 1e-3
SCHEMA = json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist-models")
    return tiny_llama_dir(root / "tiny"), tiny_llama_dir(root / "tiny2", seed=1)


@pytest.fixture(scope="module")
def single(models, log_dir):
    backend = Backend(env=ENV, log_path=str(log_dir / "dist-single.log"))
    try:
        backend.wait_healthy(120)
        assert backend.load(models[0]).success
        yield backend
    finally:
        backend.stop()


@pytest.fixture(scope="module")
def group(models, log_dir):
    g = RankGroup(2, log_dir, env=ENV, log_name="dist")
    try:
        g.wait_healthy(180)
        result = g.load(models[0])
        assert result.success, result.message
        yield g
    finally:
        g.stop()


def run(stub, opts):
    """(text, [(token id, logprob, top ids)]) of one streamed request."""
    chunks = list(stub.PredictStream(opts, timeout=120))
    entries = json.loads(chunks[-1].logprobs)["content"] if chunks[-1].logprobs else []
    return (b"".join(c.message for c in chunks).decode(),
            [(e["id"], e["logprob"], [t["id"] for t in e["top_logprobs"]]) for e in entries])


def assert_same(got, want):
    assert got[0] == want[0]
    assert [e[0] for e in got[1]] == [e[0] for e in want[1]]
    for (_, lp, top), (_, lp_want, top_want) in zip(got[1], want[1]):
        assert abs(lp - lp_want) < LOGPROB_TOL
        assert top == top_want


PROMPTS = [
    greedy("Hello there", 12),
    greedy("word " * 150, 8),  # longer than one prefill chunk (128 tokens)
    chat("Name a colour.", Tokens=10, Temperature=0.0, IgnoreEOS=True, Logprobs=1, TopLogprobs=2),
    # A grammar: each rank rebuilds it from its source and masks the same tokens.
    chat("Give me a number as JSON.", Tokens=12, Temperature=0.0, Logprobs=1,
         Metadata={"json_schema": SCHEMA}),
]


def test_greedy_tokens_and_logprobs_match_one_process(group, single):
    for opts in PROMPTS:
        want = run(single.stub, opts)
        assert want[1], "the oracle produced no tokens"
        assert_same(run(group.stub, opts), want)
        assert_same(run(group.stub, opts), want)  # again, from every rank's prefix cache


def test_seeded_sampling_matches_one_process(group, single):
    opts = backend_pb2.PredictOptions(Prompt="Once upon a time", Tokens=16, Temperature=0.9, TopP=0.95,
                                      Seed=1234, IgnoreEOS=True, Logprobs=1)
    want = run(single.stub, opts)
    assert_same(run(group.stub, opts), want)
    opts.Seed = 4321
    assert run(group.stub, opts)[1] != want[1]  # the seed is used, not a constant


def test_four_concurrent_streams_match_one_process(group, single):
    prompts = [greedy(p, 16) for p in ("The sky", "A cat sat", "1 2 3", "def main():")]
    want = [run(single.stub, p) for p in prompts]
    got = run_threads([lambda p=p: run(group.stub, p) for p in prompts])
    for g, w in zip(got, want):
        assert not isinstance(g, grpc.RpcError), g
        assert_same(g, w)


def test_cancel_mid_stream_then_keep_serving(group, single):
    stream = group.stub.PredictStream(greedy("Count with me:", 1500), timeout=120)
    for _, _chunk in zip(range(3), stream):
        pass
    stream.cancel()
    opts = greedy("After the cancel", 10)
    assert_same(run(group.stub, opts), run(single.stub, opts))


def test_a_failing_request_fails_alone(group, single):
    good = greedy("The good request", 20)
    bad = greedy("The bad request", 20, Metadata={"fault_at_token": "3"})
    got_good, got_bad = run_threads([lambda: run(group.stub, good), lambda: run(group.stub, bad)])
    assert isinstance(got_bad, grpc.RpcError) and got_bad.code() == grpc.StatusCode.INTERNAL, got_bad
    assert_same(got_good, run(single.stub, good))
    assert_same(run(group.stub, greedy("And after it", 8)), run(single.stub, greedy("And after it", 8)))


def test_forward_work_is_refused_across_ranks_and_decoding_goes_on(group, single):
    # Its forward passes would run collectives the other ranks never join.
    calls = [lambda: group.stub.Embedding(backend_pb2.PredictOptions(Embeddings="a sentence"), timeout=30),
             lambda: group.stub.Score(backend_pb2.ScoreRequest(prompt="The sky is", candidates=[" blue"]),
                                      timeout=30)]
    for call in calls:
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "across ranks" in e.value.details()
    opts = greedy("After the refusals", 8)
    assert_same(run(group.stub, opts), run(single.stub, opts))


def test_status_reports_the_group(group):
    breakdown = group.stub.Status(backend_pb2.HealthMessage(), timeout=10).memory.breakdown
    assert breakdown["group_size"] == 2
    assert breakdown["rank0_active"] > 0
    deadline = time.monotonic() + 60  # followers report with their heartbeat (a liveness bound)
    while "rank1_active" not in breakdown and time.monotonic() < deadline:
        time.sleep(0.5)
        breakdown = group.stub.Status(backend_pb2.HealthMessage(), timeout=10).memory.breakdown
    assert breakdown["rank1_active"] > 0


def test_unsplittable_model_refused_then_free_and_load_another(group, single, models):
    from loaders.model_loader import embedded_default

    # SmolLM2 has 9 attention heads and 3 KV heads: not over 2 ranks.
    result = group.load(embedded_default())
    assert not result.success
    assert "cannot be divided over 2 ranks" in result.message and "9 attention heads" in result.message
    assert "no pipeline parallelism" in result.message  # llama: mlx-lm pipelines other families only
    # What the ranks' slices cannot take yet is refused by name, not ignored.
    for fields, words in (({"CacheTypeKey": "q8_0", "CacheTypeValue": "q8_0"}, "KV cache types"),
                          ({"DraftModel": models[1]}, "draft model")):
        result = group.load(models[0], **fields)
        assert not result.success and words in result.message and "across ranks" in result.message, result.message
    opts = greedy("Still serving", 6)
    assert_same(run(group.stub, opts), run(single.stub, opts))  # the old model stays

    assert group.stub.Free(backend_pb2.HealthMessage(), timeout=30).success
    with pytest.raises(grpc.RpcError) as e:
        run(group.stub, opts)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION

    assert group.load(models[1]).success
    assert single.load(models[1]).success
    assert_same(run(group.stub, opts), run(single.stub, opts))


def test_a_follower_runs_no_model_code_unless_its_own_environment_allows_it(group, single, models):
    result = group.load(models[0], TrustRemoteCode=True)
    assert not result.success
    assert "rank 1" in result.message and "MLX_BACKEND_RANK_TRUST_REMOTE_CODE" in result.message, result.message
    opts = greedy("Still the old model", 6)
    assert_same(run(group.stub, opts), run(single.stub, opts))


def test_sigterm_to_rank0_stops_every_rank(models, log_dir):
    # A group of its own (the module's group serves the other tests in any order), stopped
    # right after its load: rank 1 may still be applying the swap when rank 0 closes.
    g = RankGroup(2, log_dir, env=ENV, log_name="dist-sigterm")
    try:
        g.wait_healthy(180)
        assert g.load(models[0]).success
        g.proc.send_signal(signal.SIGTERM)
        assert g.wait_all_exited(30), [p.poll() for p in g.procs]
        assert [p.returncode for p in g.procs] == [0, 0]
    finally:
        g.stop()


def test_killing_rank1_mid_stream_fails_the_stream_and_ends_rank0(models, log_dir):
    g = RankGroup(2, log_dir, env=ENV, log_name="dist-kill")
    try:
        g.wait_healthy(180)
        assert g.load(models[0]).success
        stream = g.stub.PredictStream(greedy("Count with me:", 1800), timeout=120)
        next(stream)
        started = time.monotonic()
        os.kill(g.followers[0].pid, signal.SIGKILL)
        with pytest.raises(grpc.RpcError) as e:
            for _ in stream:
                pass
        assert time.monotonic() - started < 30
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value
        assert "rank 1" in e.value.details()
        assert g.wait_all_exited(30), "rank 0 did not exit"
        assert g.proc.returncode not in (0, None)
    finally:
        g.stop()
    assert all(p.poll() is not None for p in g.procs)


@pytest.fixture
def veth_hosts():
    """(ips, command prefixes): rank 0 here, rank 1 in a network namespace of its own, joined by a veth pair."""
    import subprocess

    tag = f"{os.getpid() % 100000}"
    ns, here, there = f"mlxdist{tag}", f"mxa{tag}", f"mxb{tag}"
    ips = ["10.231.7.1", "10.231.7.2"]
    steps = [["ip", "netns", "add", ns],
             ["ip", "link", "add", here, "type", "veth", "peer", "name", there],
             ["ip", "link", "set", there, "netns", ns],
             ["ip", "addr", "add", f"{ips[0]}/24", "dev", here], ["ip", "link", "set", here, "up"],
             ["ip", "netns", "exec", ns, "ip", "addr", "add", f"{ips[1]}/24", "dev", there],
             ["ip", "netns", "exec", ns, "ip", "link", "set", there, "up"],
             ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"]]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", b"") or b""
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        pytest.skip(f"cannot create a network namespace with a veth pair here (root and iproute2 needed): "
                    f"{e} {detail.decode(errors='replace').strip()}")
    try:
        yield ips, [[], ["ip", "netns", "exec", ns]]
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_two_hosts_over_a_veth_pair_then_a_rank_stops_answering(veth_hosts, models, single, log_dir):
    ips, prefix = veth_hosts
    g = RankGroup(2, log_dir, env=dict(ENV, MLX_BACKEND_RANK_TIMEOUT="5"), ips=ips, prefix=prefix,
                  log_name="dist-veth")
    try:
        g.wait_healthy(180)
        assert g.load(models[0]).success
        if not single.load(models[0]).success:
            pytest.fail("the single process could not load the model back")
        prompts = [greedy(p, 12) for p in ("Over the wire", "Two hosts")]
        got = run_threads([lambda p=p: run(g.stub, p) for p in prompts])
        for got_one, p in zip(got, prompts):
            assert not isinstance(got_one, grpc.RpcError), got_one
            assert_same(got_one, run(single.stub, p))
        # Rank 1 freezes: rank 0's engine waits in a collective that never ends; the heartbeat
        # watchdog fails the stream, names the rank and ends rank 0 anyway.
        stream = g.stub.PredictStream(greedy("Count with me:", 1800), timeout=120)
        next(stream)
        started = time.monotonic()
        os.kill(g.followers[0].pid, signal.SIGSTOP)
        with pytest.raises(grpc.RpcError) as e:
            for _ in stream:
                pass
        assert time.monotonic() - started < 40
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE and "rank 1" in e.value.details(), e.value
        deadline = time.monotonic() + 30
        while g.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert g.proc.returncode not in (0, None)
        os.kill(g.followers[0].pid, signal.SIGCONT)  # woken, it finds rank 0 gone and ends
        assert g.wait_all_exited(30)
    finally:
        g.stop()


@pytest.mark.skipif(os.environ.get("MLX_BACKEND_DIST_QWEN") != "1",
                    reason="slow (~1 tok/s over 2 ranks on a 2-core CPU): set MLX_BACKEND_DIST_QWEN=1")
def test_qwen_coder_over_two_ranks_matches_one_process(log_dir):
    from models import qwen_coder_gguf

    path = qwen_coder_gguf()  # 14 attention heads, 2 KV heads: 7 and 1 per rank
    opts = chat("Write a Python function that adds two numbers.", Tokens=6, Temperature=0.0, Logprobs=1)
    with Backend(log_path=str(log_dir / "dist-qwen-single.log")) as single_qwen:
        assert single_qwen.load(path).success
        want = run(single_qwen.stub, opts)
        whole = single_qwen.stub.Status(backend_pb2.HealthMessage(), timeout=10).memory.breakdown["active"]
    g = RankGroup(2, log_dir, log_name="dist-qwen")
    try:
        g.wait_healthy(180)
        result = g.load(path)
        assert result.success, result.message
        assert_same(run(g.stub, opts), want)
        deadline = time.monotonic() + 60  # rank 1's figures come with its heartbeat
        mem = g.stub.Status(backend_pb2.HealthMessage(), timeout=10).memory.breakdown
        while "rank1_active" not in mem and time.monotonic() < deadline:
            time.sleep(0.5)
            mem = g.stub.Status(backend_pb2.HealthMessage(), timeout=10).memory.breakdown
        print(f"one process {whole / 1e6:.0f} MB; per rank {mem['rank0_active'] / 1e6:.0f} / "
              f"{mem['rank1_active'] / 1e6:.0f} MB, peak {mem['peak'] / 1e6:.0f} / {mem['rank1_peak'] / 1e6:.0f} MB")
        # The layers are split, the embeddings (a quarter of this model) are not.
        assert max(mem["rank0_active"], mem["rank1_active"]) < 0.8 * whole
    finally:
        g.stop()


def _dropped_within(sock, seconds: float) -> bool:
    """Does rank 0 close this connection within `seconds` (whatever it sent first)?"""
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def _greeted(port: int):
    """A connection past rank 0's greeting: (socket, rank 0's nonce)."""
    from engine.lockstep import wire

    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    greeting = wire.recv_exact(sock, len(wire.MAGIC) + wire.NONCE_BYTES)
    assert greeting.startswith(wire.MAGIC)
    return sock, greeting[len(wire.MAGIC):]


def _hello(port: int, hello: dict, secret: str) -> socket.socket:
    """A peer that frames `hello` correctly, under `secret`."""
    from engine.lockstep import group as lgroup, wire

    sock, leader_nonce = _greeted(port)
    mine = os.urandom(wire.NONCE_BYTES)
    sock.sendall(mine)
    key = wire.session_key(lgroup.group_secret({"MLX_BACKEND_GROUP_SECRET": secret}), leader_nonce, mine)
    wire.Channel(sock, key, leader=False, max_in=1 << 20, max_out=1 << 20).send(hello)
    return sock


def test_strangers_at_the_control_port_are_dropped_while_the_group_forms(models, single, log_dir):
    import struct

    from dist_support import GROUP_SECRET

    port = free_port()
    # Rank 1 reaches the control port late, so every stranger below comes first.
    env = dict(ENV, MLX_BACKEND_CONTROL_PORT=str(port), MLX_BACKEND_FAULT_RANK_CONNECT_DELAY="8")
    g = RankGroup(2, log_dir, env=env, log_name="dist-strangers")
    try:
        deadline = time.monotonic() + 120
        while "control channel waiting" not in open(g.log_path, errors="replace").read():
            assert time.monotonic() < deadline and g.proc.poll() is None, "rank 0 never opened its control port"
            time.sleep(0.1)
        started = time.monotonic()
        silent = socket.create_connection(("127.0.0.1", port), timeout=30)
        garbage = socket.create_connection(("127.0.0.1", port), timeout=30)
        garbage.sendall(os.urandom(1024))
        old_style = socket.create_connection(("127.0.0.1", port), timeout=30)
        old_style.sendall(struct.pack(">I", 2) + b"{}" + b"\0" * 64)  # an unauthenticated hello of {}
        empty = _hello(port, {}, GROUP_SECRET)  # authenticated, but no rank
        wrong_key = _hello(port, {"rank": 1}, "not-the-secret")  # a stranger claiming rank 1
        oversized, _ = _greeted(port)
        oversized.sendall(os.urandom(16) + struct.pack(">I", 0xFFFFFFFF))
        peers = {"garbage": garbage, "old-style {}": old_style, "{}": empty, "bad MAC": wrong_key,
                 "oversized": oversized, "silent": silent}
        for name, sock in peers.items():
            assert _dropped_within(sock, 40), f"rank 0 kept the {name} connection"
            sock.close()
        assert time.monotonic() - started < 60  # the silent one is cut at the handshake bound (10 s)

        g.wait_healthy(180)  # the real rank 1 joined after all of them
        assert g.proc.poll() is None
        result = g.load(models[0])
        assert result.success, result.message
        assert single.load(models[0]).success
        opts = greedy("After the strangers", 8)
        assert_same(run(g.stub, opts), run(single.stub, opts))
        log = open(g.log_path, errors="replace").read()
        assert log.count("dropped a connection") >= len(peers), log[-3000:]
    finally:
        g.stop()

