"""Boundary snapshots (engine.prefix.snapshots) hold exactly what mlx-lm's own classes leave.

A prompt admitted to the text batch of a model whose cache cannot be trimmed
(a rotating window past its size, a recurrent state) leaves a snapshot in the
prefix cache at each boundary and at the prompt's end (all tokens but the last).
Each must be, bit for bit, the state a cold prefill with mlx-lm's own cache
classes (make_prompt_cache and the model's forward pass) leaves after the same
tokens, fed in the same passes: prefill-step chunks, restarting at each earlier
boundary (a rotating cache's layout depends on where its passes end). The first
boundary is therefore exactly a cold prefill of its prefix. Also: a prompt equal to
a snapshot restores the longest entry short of it (its last token gives the
logits), a plain KV model takes no snapshots, and every rank of a group stops
at the same boundaries.
"""

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from mlx_lm import load  # noqa: E402
from mlx_lm.models.cache import CacheList, KVCache, make_prompt_cache  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

from engine.lanes.sampling import SamplingParams  # noqa: E402
from engine.lanes.text_batch import TextBatch  # noqa: E402
from family_models import build  # noqa: E402

STEP = 32  # prefill step: the 70-token prompt takes several passes


class LM:
    def __init__(self, model, tokenizer):
        self.model, self.tokenizer, self.epoch = model, tokenizer, 0


@pytest.fixture(scope="module", params=["gemma3_text", "qwen3_next"])
def family(request):
    model, tokenizer = load(build(request.param))
    return request.param, LM(model, tokenizer)


def held(cache) -> list:
    """Every array and number a cache holds, as numpy (a KV cache: its filled part only,
    not the spare room its buffer grows by)."""
    out = []
    for c in cache:
        if isinstance(c, CacheList):
            out += held(c.caches)
        elif type(c) is KVCache:
            out += [np.array(c.keys[..., :c.offset, :]), np.array(c.values[..., :c.offset, :]), c.offset]
        else:
            out += [np.array(a) if isinstance(a, mx.array) else a for _, a in tree_flatten(c.state)]
    return out


def cold(model, tokens, cuts):
    """mlx-lm's own prefill of `tokens`: passes of at most STEP tokens, also ending at `cuts`."""
    cache = make_prompt_cache(model)
    start = 0
    for end in sorted({*cuts, len(tokens)}):
        for a in range(start, end, STEP):
            model(mx.array([tokens[a:min(a + STEP, end)]]), cache=cache)
        start = end
    mx.eval([c.state for c in cache])
    return cache


def run(lm, prompt, boundaries, direct):
    batch = TextBatch(lm, max_sequences=4, prefill_batch_size=2, prefill_step_size=STEP,
                      prompt_cache_bytes=1 << 30, prompt_cache_entries=100,
                      stream=mx.default_stream(mx.default_device()))
    errors = []
    uid, cached, first = batch.admit(prompt, 3, SamplingParams(), [], False, errors.append,
                                     direct=direct, boundaries=boundaries)
    assert cached == 0 and not errors
    for _ in range(len(prompt)):  # the prefill's chunks, then decode steps until done
        if any(r.finish_reason for r in batch.step()):
            break
    return batch


def assert_same(got, want):
    a, b = held(got), held(want)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert np.array_equal(x, y), (np.shape(x), np.shape(y))


@pytest.mark.parametrize("direct, length", [(False, 70), (True, 30)])
def test_a_snapshot_is_what_a_cold_prefill_leaves(family, direct, length):
    name, lm = family
    prompt = [int(t) for t in np.random.RandomState(1).randint(3, 1000, size=length)]
    batch = run(lm, prompt, [20], direct)
    for p, cuts in ((20, []), (length - 1, [20])):
        cache, rest = batch.cache.fetch_nearest_cache(lm.epoch, prompt[:p])
        assert cache is not None and rest == [], (name, p, "no snapshot")
        assert_same(cache, cold(lm.model, prompt[:p], cuts))


def test_the_same_prompt_again_restores_the_end_of_prompt_snapshot(family):
    name, lm = family
    prompt = [int(t) for t in np.random.RandomState(2).randint(3, 1000, size=40)]
    batch = run(lm, prompt, [], direct=True)
    uid, cached, first = batch.admit(prompt, 3, SamplingParams(), [], False, lambda e: None, direct=True)
    assert cached == len(prompt) - 1, name


def test_a_plain_kv_model_takes_no_snapshots():
    model, tokenizer = load(build("llama"))
    lm = LM(model, tokenizer)
    prompt = [int(t) for t in np.random.RandomState(3).randint(3, 1000, size=40)]
    batch = run(lm, prompt, [20], direct=False)
    assert not batch.snapshots
    assert batch.cache.nbytes == 0  # nothing kept (the engine keeps the finished request)


def test_a_prompt_equal_to_a_snapshot_restores_the_longest_one_short_of_it(family):
    """A wholly cached prompt still needs its last token's logits: a cache that cannot drop
    that token is not used whole, the longest entry short of it is (here the boundary's)."""
    name, lm = family
    prompt = [int(t) for t in np.random.RandomState(4).randint(3, 1000, size=40)]
    batch = run(lm, prompt, [20], direct=True)
    uid, cached, first = batch.admit(prompt[:39], 3, SamplingParams(), [], False, lambda e: None, direct=True)
    assert cached == 20, name


class _Inner:
    """A text batch that records what it is asked to admit."""
    from engine.lanes.batch import Capabilities

    capabilities = Capabilities()

    def __init__(self):
        self.admitted = []

    def admit(self, *args, **kwargs):
        self.admitted.append(kwargs.get("boundaries"))
        return 0, 0, None


def test_every_rank_of_a_group_stops_at_the_same_boundaries():
    """Rank 0 journals an admission's boundaries and a follower replays them: each rank runs
    the same prefill passes (a tensor-parallel pass needs every rank) and keeps the same snapshots."""
    from engine.lockstep.follower import Follower
    from engine.lockstep.leader import RecordingBatch

    class Leader:
        lost, sent = None, []

        def send(self, message):
            self.sent.append(message)

    leader, inner = Leader(), _Inner()
    batch = RecordingBatch(inner, leader, {})
    batch.admit([1, 2, 3, 4, 5, 6], 4, SamplingParams(), [], False, lambda e: None, direct=True, boundaries=[3])
    (op,) = [o for m in leader.sent for o in m["ops"] if o["k"] == "admit"]
    from engine.lockstep.follower import _Slot

    follower = Follower.__new__(Follower)
    follower.served, follower.probing = _Slot(), _Slot()
    follower.served.text = _Inner()
    follower._apply(op)
    assert inner.admitted == follower.served.text.admitted == [[3]]
