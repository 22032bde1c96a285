"""Lockstep's pure pieces: the wire form of an admission, the frames, the split check."""

import json
import socket
import threading

import pytest
from hypothesis import given, settings, strategies as st

from engine.lockstep import group, wire
from loaders.model_loader import ModelLoadError
from engine.sampling import SamplingParams

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


@settings(max_examples=30, deadline=None)
@given(st.lists(st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=300), max_size=6),
                min_size=1, max_size=8))
def test_frames_arrive_whole_and_in_order(messages):
    a, b = socket.socketpair()
    lock = threading.Lock()
    try:
        sender = threading.Thread(target=lambda: [wire.send_frame(a, lock, m) for m in messages])
        sender.start()
        got = [wire.recv_frame(b) for _ in messages]
        sender.join()
        assert got == messages
        a.close()
        with pytest.raises(ConnectionError):
            wire.recv_frame(b)
    finally:
        a.close()
        b.close()


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
def test_the_split_check(dims, named):
    heads, kv, width, n = dims
    config = {"model_type": "m", "num_attention_heads": heads, "num_key_value_heads": kv, "intermediate_size": width}
    if not named:
        group.check_shardable(_Shardable(), config, n)
        return
    with pytest.raises(ModelLoadError) as e:
        group.check_shardable(_Shardable(), config, n)
    assert f"cannot be split over {n} ranks: {', '.join(named)} do not divide by {n}" in str(e.value)


def test_an_architecture_without_tensor_parallelism_is_refused():
    with pytest.raises(ModelLoadError, match="no tensor parallelism"):
        group.check_shardable(object(), {"model_type": "m", "num_attention_heads": 4}, 2)
