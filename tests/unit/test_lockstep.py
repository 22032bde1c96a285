"""Lockstep's pure pieces: the wire form of an admission, the frames, the split check."""

import json
import socket
import threading

import pytest
from hypothesis import given, settings, strategies as st

from engine.lockstep import group, wire
from loaders.model_loader import ModelLoadError
from engine.lanes.sampling import SamplingParams

floats = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, width=32)
sampling = st.builds(
    SamplingParams, temperature=st.floats(0, 2), top_p=st.floats(0, 1), top_k=st.integers(0, 1000),
    min_p=st.floats(0, 1), seed=st.integers(0, 2**32 - 1), repetition_penalty=st.floats(0, 2),
    repetition_context_size=st.integers(1, 100), presence_penalty=st.floats(-2, 2),
    frequency_penalty=st.floats(-2, 2), logit_bias=st.dictionaries(st.integers(0, 50000), floats, max_size=5),
    xtc_probability=st.floats(0, 1), xtc_threshold=st.floats(0, 0.5),
    xtc_special_tokens=st.lists(st.integers(0, 50000), max_size=3))


def _tagged(*spec):
    def processor(tokens, logits):
        return logits
    processor.remote = spec
    return processor


@settings(max_examples=60, deadline=None)
@given(sampling, st.lists(st.integers(0, 50000), min_size=1, max_size=50), st.integers(1, 4096), st.booleans(),
       st.booleans())
def test_an_admission_survives_the_wire(params, prompt, max_tokens, ignore_eos, direct):
    extra = [_tagged("grammar", "start: /[0-9]+/", "Grammar", -1), _tagged("fault_at", 3)]
    op = json.loads(json.dumps(wire.admit_wire(prompt, max_tokens, params, extra, ignore_eos, direct)))
    assert wire.sampling_from_wire(op["sampling"]) == params
    assert (op["prompt"], op["max"], op["eos"], op["direct"]) == (prompt, max_tokens, ignore_eos, direct)
    assert op["extra"] == [["grammar", "start: /[0-9]+/", "Grammar", -1], ["fault_at", 3]]


def test_a_processor_without_its_source_is_refused():
    with pytest.raises(RuntimeError, match="cannot be rebuilt"):
        wire.admit_wire([1], 4, SamplingParams(), [lambda t, x: x], False, False)


class _Wire:
    """A socket stand-in: what is sent is kept; what is received comes in the given split sizes."""

    def __init__(self, data: bytes = b"", splits=()):
        self.sent = bytearray()
        self.data, self.splits, self.read = bytes(data), list(splits), 0

    def sendall(self, b):
        self.sent += b

    def recv(self, n):
        size = self.splits.pop(0) if self.splits else n
        chunk = self.data[self.read:self.read + max(1, min(n, size))]
        self.read += len(chunk)
        return chunk

    def settimeout(self, t):
        pass


KEY = b"k" * 32


def _frames(messages, key=KEY) -> bytes:
    out = _Wire()
    sender = wire.Channel(out, key, leader=True, max_in=1 << 20, max_out=1 << 20)
    for m in messages:
        sender.send(m)
    return bytes(out.sent)


def _receiver(data, splits=(), key=KEY, max_in=1 << 20):
    return wire.Channel(_Wire(data, splits), key, leader=False, max_in=max_in, max_out=1 << 20)


messages_st = st.lists(st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=300), max_size=6),
                       min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(messages_st, st.lists(st.integers(1, 64), max_size=200))
def test_frames_arrive_whole_and_in_order_however_the_bytes_are_split(messages, splits):
    rx = _receiver(_frames(messages), splits)
    assert [rx.recv() for _ in messages] == messages
    with pytest.raises(ConnectionError):
        rx.recv()


@settings(max_examples=60, deadline=None)
@given(messages_st, st.data())
def test_any_changed_byte_after_the_length_fails_authentication(messages, data):
    stream = bytearray(_frames(messages[:1]))
    at = data.draw(st.integers(4, len(stream) - 1))
    stream[at] ^= data.draw(st.integers(1, 255))
    with pytest.raises(wire.FrameError, match="authentication"):
        _receiver(bytes(stream)).recv()


def test_a_replayed_or_reflected_frame_fails_authentication():
    one = _frames([{"k": "hb"}])
    rx = _receiver(one + one)
    assert rx.recv() == {"k": "hb"}
    with pytest.raises(wire.FrameError, match="authentication"):
        rx.recv()  # the same bytes again: the frame number differs
    reflected = wire.Channel(_Wire(one), KEY, leader=True, max_in=1 << 20, max_out=1 << 20)
    with pytest.raises(wire.FrameError, match="authentication"):
        reflected.recv()  # rank 0's own frame sent back to it


def test_a_frame_under_another_key_fails_authentication():
    with pytest.raises(wire.FrameError, match="authentication"):
        _receiver(_frames([{"rank": 1}], key=b"x" * 32)).recv()


def test_an_oversized_length_is_refused_before_its_body_is_read():
    import struct

    rx = _receiver(struct.pack(">I", 0xFFFFFFFF) + b"\0" * 64)
    with pytest.raises(wire.FrameError, match="4294967295 bytes is over the 1024-byte bound"):
        rx.max_in = 1024
        rx.recv()
    assert rx.sock.read == 4  # neither its tag nor its body was read
    with pytest.raises(wire.FrameError, match="over the 100-byte bound"):
        wire.Channel(_Wire(), KEY, leader=True, max_in=100, max_out=100).send({"k": "x" * 200})


def _hello_stream(hello, secret=b"s", follower_nonce=b"f" * 16, leader_nonce=None):
    """What a follower would send to rank 0 (whose nonce is fixed here) after the greeting."""
    key = wire.session_key(secret, leader_nonce, follower_nonce)
    out = _Wire()
    wire.Channel(out, key, leader=False, max_in=1 << 20, max_out=1 << 20).send(hello)
    return follower_nonce + bytes(out.sent)


@pytest.mark.parametrize("hello,why", [
    ({}, "rank None"), ({"rank": 0}, "rank 0"), ({"rank": 4}, "rank 4"), ({"rank": True}, "rank True"),
    ({"rank": "1"}, "rank '1'"), ({"rank": 1.0}, "rank 1.0")])
def test_rank0_refuses_a_hello_without_a_valid_rank(hello, why, monkeypatch):
    monkeypatch.setattr(wire.os, "urandom", lambda n: b"L" * n)
    sock = _Wire(_hello_stream(hello, leader_nonce=b"L" * 16))
    with pytest.raises(wire.FrameError, match=f"names {why}, not one of 1..3"):
        wire.accept_hello(sock, b"s", 4, 1.0)
    assert bytes(sock.sent) == wire.MAGIC + b"L" * 16


def test_rank0_accepts_a_hello_under_the_secret_and_refuses_another(monkeypatch):
    monkeypatch.setattr(wire.os, "urandom", lambda n: b"L" * n)
    sock = _Wire(_hello_stream({"rank": 2}, leader_nonce=b"L" * 16))
    rank, channel = wire.accept_hello(sock, b"s", 4, 1.0)
    assert rank == 2 and channel.max_in == wire.FOLLOWER_MAX_FRAME
    with pytest.raises(wire.FrameError, match="authentication"):
        wire.accept_hello(_Wire(_hello_stream({"rank": 2}, secret=b"other", leader_nonce=b"L" * 16)), b"s", 4, 1.0)


def test_a_follower_and_rank0_agree_over_a_real_connection():
    a, b = socket.socketpair()
    got = {}

    def leader():
        got["rank"], got["channel"] = wire.accept_hello(a, b"secret", 3, 5.0)

    t = threading.Thread(target=leader)
    t.start()
    follower = wire.open_hello(b, b"secret", 2, 5.0)
    t.join()
    try:
        assert got["rank"] == 2
        got["channel"].send({"k": "ops", "ops": [{"k": "step"}]})
        assert follower.recv() == {"k": "ops", "ops": [{"k": "step"}]}
        follower.send({"k": "hb", "memory": {"active": 1}})
        assert got["channel"].recv() == {"k": "hb", "memory": {"active": 1}}
    finally:
        a.close()
        b.close()


def test_the_group_secret_comes_from_the_environment():
    with pytest.raises(SystemExit, match="MLX_BACKEND_GROUP_SECRET"):
        group.group_secret({})
    token = "tok-123"
    derived = group.group_secret({"LOCALAI_GRPC_AUTH_TOKEN": token})
    assert derived != token.encode() and len(derived) == 32
    own = group.group_secret({"LOCALAI_GRPC_AUTH_TOKEN": token, "MLX_BACKEND_GROUP_SECRET": "x"})
    assert own not in (derived, b"x") and own == group.group_secret({"MLX_BACKEND_GROUP_SECRET": "x"})


class _Shardable:
    def shard(self, group):
        pass


# (heads, KV heads, MLP width, ranks) -> the numbers named in the refusal (hand table)
CASES = [
    ((14, 2, 4864, 2), []),
    ((9, 3, 1536, 2), ["9 attention heads", "3 KV heads"]),
    ((32, 8, 11008, 4), []),
    ((32, 8, 11006, 4), ["11006 MLP width"]),
    ((12, 4, 3072, 8), ["12 attention heads", "4 KV heads"]),
]


@pytest.mark.parametrize("dims,named", CASES)
def test_the_tensor_split_check(dims, named):
    heads, kv, width, n = dims
    config = {"model_type": "m", "num_attention_heads": heads, "num_key_value_heads": kv, "intermediate_size": width}
    why = group.tensor_obstacle(_Shardable(), config, n)
    assert why == (f"{', '.join(named)} do not divide by {n}" if named else None)


class _Piped:
    """A model as mlx-lm's pipelined families hold one: `model.model.pipeline` over `layers`."""

    def __init__(self, layers: int, shard: bool = True, takes_split: bool = True):
        def pipeline(self, group, split=None):
            pass

        def even(self, group):  # kimi_k3's: no split
            pass

        self.model = type("Inner", (), {"layers": [None] * layers, "pipeline": pipeline if takes_split else even})()
        if shard:
            self.shard = lambda g: None


def _group(n: int, hosts=None) -> "group.Group":
    hosts = hosts or ["127.0.0.1"] * n
    return group.Group(rank=0, size=n, mx_group=None, hosts=[[f"{h}:{5000 + i}"] for i, h in enumerate(hosts)])


CONFIG = {"model_type": "m", "num_attention_heads": 6, "num_key_value_heads": 6, "intermediate_size": 96}


# (layers, ranks, hosts, wanted, split, heads) -> the mode chosen, or the words of the refusal (hand table)
MODES = [
    ((4, 2, None, "auto", None, 6), "tensor"),  # one machine, it divides: tensor
    ((4, 2, ["10.0.0.1", "10.0.0.2"], "auto", None, 6), "pipeline"),  # two machines: pipeline
    ((4, 3, None, "auto", None, 4), "pipeline"),  # 4 heads over 3: pipeline
    ((2, 3, None, "auto", None, 4), "tensor parallelism: 4 attention heads"),  # neither: both reasons
    ((4, 2, None, "pipeline", None, 6), "pipeline"),
    ((4, 2, None, "auto", (3, 1), 6), "pipeline"),  # a split asks for the pipeline
    ((4, 2, None, "pipeline", (3, 2), 6), "pipeline_split 3,2 must give each of the 2 ranks"),
    ((4, 2, None, "tensor", (3, 1), 6), "pipeline_split is for parallel:pipeline"),
    ((4, 3, None, "tensor", None, 4), "by tensor parallelism: 4 attention heads"),
    ((2, 3, None, "pipeline", None, 6), "its 2 layers cannot give each of 3 ranks one"),
]


@pytest.mark.parametrize("case,want", MODES)
def test_the_mode_is_chosen_by_the_option_the_hosts_and_what_divides(case, want):
    layers, n, hosts, wanted, split, heads = case
    config = dict(CONFIG, num_attention_heads=heads, num_key_value_heads=heads)
    if want in ("tensor", "pipeline"):
        assert group.choose_mode(_Piped(layers), config, _group(n, hosts), wanted, split) == want
        return
    with pytest.raises(ModelLoadError) as e:
        group.choose_mode(_Piped(layers), config, _group(n, hosts), wanted, split)
    assert want in str(e.value)


def test_a_split_is_refused_where_the_library_spreads_the_layers_itself():
    with pytest.raises(ModelLoadError) as e:
        group.choose_mode(_Piped(4, takes_split=False), dict(CONFIG), _group(2), "pipeline", (3, 1))
    assert "takes no pipeline_split" in str(e.value)
    assert group.choose_mode(_Piped(4, takes_split=False), dict(CONFIG), _group(2), "pipeline") == "pipeline"


def test_an_architecture_without_either_is_refused_with_both_reasons():
    with pytest.raises(ModelLoadError) as e:
        group.choose_mode(object(), dict(CONFIG), _group(2))
    assert "its Model has no shard()" in str(e.value) and "its model has no pipeline()" in str(e.value)
    assert group.choose_mode(_Piped(4, shard=False), dict(CONFIG), _group(2)) == "pipeline"


def test_a_trickling_hello_is_cut_off_at_the_handshake_bound():
    import struct
    import time

    a, b = socket.socketpair()
    stop = threading.Event()

    def trickle():  # a plausible start, then one byte at a time, never finishing
        stream = b"n" * wire.NONCE_BYTES + struct.pack(">I", 4000) + b"t" * 10_000
        try:
            for byte in stream:
                if stop.wait(0.2):
                    return
                b.sendall(bytes([byte]))
        except OSError:
            pass

    t = threading.Thread(target=trickle)
    t.start()
    started = time.monotonic()
    try:
        with pytest.raises(socket.timeout):
            wire.accept_hello(a, b"s", 2, 1.0)
        assert time.monotonic() - started < 20  # byte by byte the hello would take 14 minutes
    finally:
        stop.set()
        t.join()
        a.close()
        b.close()


class _Share:
    """A rank's share of a prefix-cache entry: only its size matters to the store's bounds."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes

    def is_trimmable(self) -> bool:
        return False


def _keys(store) -> list:
    return sorted((kind, tuple(tokens)) for kind, lru in store._lru._lrus.items() for _, tokens in lru)


_entries = st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=6),  # its tokens
                              st.integers(1, 100), st.integers(1, 100),  # rank 0's bytes, the follower's
                              st.sampled_from(["assistant", "user", "system"])), max_size=40)


@settings(max_examples=200, deadline=None)
@given(entries=_entries, max_size=st.integers(1, 5), max_bytes=st.integers(50, 300))
def test_every_rank_keeps_the_prefixes_rank_0_keeps_whatever_their_shares_weigh(entries, max_size, max_bytes):
    """In a pipeline each rank holds other layers of an entry, so its bytes differ from rank 0's:
    a follower's store has no bounds of its own and evicts what rank 0's journal says rank 0's
    bounds evicted. After every insert both hold the same keys, and every prompt finds the same
    cached prefix on both (a different one would make the ranks run different passes)."""
    from engine.lockstep.leader import UNBOUNDED
    from engine.prefix.prompt_store import PromptStore

    rank0 = PromptStore(max_size=max_size, max_bytes=max_bytes)
    rank0.dropped = []
    follower = PromptStore(max_size=UNBOUNDED, max_bytes=UNBOUNDED)
    for tokens, mine, theirs, kind in entries:
        for probe in (tokens, tokens[:-1] + [9]):
            assert len(rank0.fetch_nearest_cache(1, probe)[1]) == len(follower.fetch_nearest_cache(1, probe)[1])
        rank0.insert_cache(1, tokens, [_Share(mine)], cache_type=kind)
        follower.insert_cache(1, tokens, [_Share(theirs)], cache_type=kind)
        for key in rank0.dropped:  # as the journal's "drop" carries it
            follower.drop(1, key)
        rank0.dropped = []
        assert _keys(follower) == _keys(rank0)
        assert len(rank0) <= max_size and rank0.nbytes <= max(max_bytes, mine)
