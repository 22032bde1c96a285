"""The pure parts of the lane choice and the solo lane: comparing a lane's run with the
reference run, what Status reports, which caches the prefix cache serves, how the solo
lane cuts a prefill, and the admission bounds of a lane that runs one request at a time."""

from types import SimpleNamespace

import pytest
from mlx_lm.models.cache import ArraysCache, CacheList, ChunkedKVCache, KVCache, RotatingKVCache

from engine.admission import Admission
from engine.config import EngineConfig
from engine.lane_choice import differs, lane_figures
from engine.lane_tolerance import Tolerance
from engine.lane_probe import Outcome, outlast_joins
from engine.lanes.solo import SoloBatch
from engine.prefix import kinds
from engine.requests import Request
from loaders.loaded import Lane


def out(tokens, margins=None, finish="length", error=None):
    return Outcome(tokens=list(tokens), logprobs=[-0.1] * len(tokens),
                   margins=list(margins or [1.0] * len(tokens)), finish=finish, error=error)


def test_the_same_tokens_do_not_differ():
    ref = [out([1, 2, 3]), out([4, 5, 6])]
    assert differs(ref, [out([1, 2, 3]), out([4, 5, 6])]) is None


def test_another_token_differs_and_says_where():
    why = differs([out([1, 2, 3]), out([4, 5, 6])], [out([1, 2, 3]), out([4, 9, 6])])
    assert why == "gives other tokens than the single stream (request B, token 2)"


def test_past_a_near_tie_either_token_is_the_librarys():
    ref = [out([1, 2, 3], margins=[1.0, 5e-4, 1.0])]
    assert differs(ref, [out([1, 7, 8])]) is None
    assert differs(ref, [out([9, 7, 8])]) == "gives other tokens than the single stream (request A, token 1)"


def test_the_same_tokens_with_other_log_probabilities_differ():
    # afm7 batched: three probe tokens equal, their log-probabilities 0.3 apart, other text later.
    ref = [out([1, 2, 3])]
    moved = out([1, 2, 3])
    moved.logprobs[1] += 0.29
    assert differs(ref, [moved]) == ("gives other log-probabilities than the single stream (request A, token 2: "
                                     "0.29 apart, its noise allows 0.001)")
    # bfloat16 (eps 2^-7) at -0.1 - 1.0 (spacing 2^-7): 4 x 10 spacings = 0.31 allowed, 4 x 9 = 0.28 not
    assert differs(ref, [moved], Tolerance(2.0 ** -7, units=10)) is None
    assert differs(ref, [moved], Tolerance(2.0 ** -7, units=9)) is not None
    moved.logprobs[1] = ref[0].logprobs[1] + 2e-6  # float32 rounding of a batched matmul
    assert differs(ref, [moved]) is None


def test_rounding_allowed_follows_the_coarsest_float_of_the_model():
    import mlx.core as mx
    import mlx.nn as nn

    from loaders.rounding import FLOOR, allowed

    model = nn.Linear(4, 4)
    assert allowed(model) == FLOOR
    model.set_dtype(mx.bfloat16)
    assert allowed(model) == 0.25
    quantized = nn.QuantizedLinear(64, 8)  # uint32 weights, float32 scales: float32 rounding
    assert allowed(quantized) == FLOOR


def test_a_failed_request_or_another_end_differs():
    ref = [out([1, 2, 3])]
    assert differs(ref, [out([], error="INTERNAL: boom")]) == "fails request A (INTERNAL: boom)"
    assert differs(ref, [out([1, 2, 3], finish="stop")]) == "ends request A otherwise than the single stream"
    assert differs(ref, [out([1, 2])]) == "gives other tokens than the single stream (request A, token 3)"


def test_probes_decode_until_the_later_ones_have_joined():
    # Jina-VLM's image prompts (~450 tokens, 4 chunks of 128) joined the check's batch after the
    # first probe's 3 tokens had ended, so rows never decoded together and a batch that shifts a
    # joining row's positions (its library's RoPE, at the batch's largest offset) was kept.
    class Model:
        context_size = 4096

    probes = [Request(prompt=[1] * n, max_tokens=3) for n in (478, 438, 20)]
    outlast_joins(Model(), probes, 128)
    assert [r.max_tokens for r in probes] == [3 + 4 + 1] * 3
    Model.context_size = 484  # within the context, never under what was asked
    probes = [Request(prompt=[1] * n, max_tokens=3) for n in (478, 438, 20)]
    outlast_joins(Model(), probes, 128)
    assert [r.max_tokens for r in probes] == [6, 8, 8]
    alone = [Request(prompt=[1] * 478, max_tokens=3)]
    outlast_joins(Model(), alone, 128)
    assert alone[0].max_tokens == 3


def test_status_says_the_lane():
    assert lane_figures(None) == {}
    assert lane_figures(SimpleNamespace(lane=Lane(solo=True))) == {"lane_solo": 1, "lane_prefill_alone": 0}
    assert lane_figures(SimpleNamespace(lane=Lane(prefill_alone=True))) == {"lane_solo": 0, "lane_prefill_alone": 1}
    assert (Lane().name, Lane(solo=True).name) == ("batch", "solo")
    assert Lane(prefill_alone=True).name == "batch, each prompt prefilled alone"


def test_the_prefix_cache_serves_the_kinds_it_can_cut_back_exactly():
    assert kinds.unserved([KVCache(), RotatingKVCache(max_size=8), ArraysCache(2)]) is None
    assert kinds.unserved([CacheList(KVCache(), ArraysCache(1))]) is None
    assert kinds.unserved([KVCache(), ChunkedKVCache(8)]) == "ChunkedKVCache"
    assert kinds.unserved([CacheList(KVCache(), object())]) == "object"


def test_the_solo_prefill_is_cut_by_chunks_and_at_snapshot_positions():
    lane = SoloBatch.__new__(SoloBatch)
    lane.prefill_step_size = 4
    body = list(range(10, 20))  # prompt positions 3..12, the prompt's last token (13) left to the step
    assert lane._pieces(body, 3, []) == [[10, 11, 12, 13], [14, 15, 16, 17], [18, 19]]
    # Snapshots at 5 and at the end of the body (13): a chunk ends at each.
    assert lane._pieces(body, 3, [5, 13]) == [[10, 11], [12, 13, 14, 15], [16, 17, 18, 19]]
    assert lane._pieces([], 7, [7]) == []


def test_a_lane_of_one_place_bounds_the_queue_by_that_place():
    config = EngineConfig(max_sequences=8, max_waiting=1, kv_budget_bytes=0)
    admission = Admission()
    admission.reset(None, config, None)
    request = Request(prompt=[1, 2, 3], max_tokens=4)
    # One running in the solo lane (one place): one may wait, the next is refused.
    assert admission.reserve(request, None, config, 1, 1, 0)[1] is None
    why = admission.reserve(request, None, config, 1, 1, 1)[1]
    assert why is not None and "max_waiting=1" in why
    # The batch's eight places: the same request would be admitted this pass.
    assert admission.reserve(request, None, config, 8, 1, 1)[1] is None


def test_an_open_ended_request_in_a_lane_of_one_place_gets_the_whole_budget():
    class Model:
        kv_bytes_per_token = 10

    config = EngineConfig(max_sequences=4, kv_budget_bytes=1000)
    admission = Admission()
    admission.reset(Model(), config, None)

    def shortened(places: int) -> int:
        request = Request(prompt=[1] * 10, max_tokens=10_000, open_ended=True)
        admission.reserve(request, Model(), config, places, 0, 0)
        return request.max_tokens

    assert shortened(4) == 1000 // 4 // 10 - 10
    assert shortened(1) == 1000 // 10 - 10


def test_a_verdict_is_kept_per_model_and_batch_settings(tmp_path, monkeypatch):
    from engine import lane_verdicts
    from loaders.loaded import LoadedModel

    monkeypatch.setenv("MLX_BACKEND_CACHE_DIR", str(tmp_path))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    lm = LoadedModel(name="m", source=str(tmp_path / "model"), model=None, tokenizer=None, config={},
                     context_size=64, dtype="float32", options={}, load_seconds=0.0)
    config = EngineConfig()
    assert lane_verdicts.read(lm, config) is None
    lane_verdicts.write(lm, config, Lane(prefill_alone=True, reason="why"))
    assert lane_verdicts.read(lm, config) == Lane(prefill_alone=True, reason="why")
    assert lane_verdicts.read(lm, EngineConfig(max_sequences=2)) is None  # another batch: checked again
    (tmp_path / "model" / "config.json").write_text('{"changed": 1}')  # another model file: again
    assert lane_verdicts.read(lm, config) is None


def test_a_kept_verdict_is_private_and_a_damaged_one_is_checked_again(tmp_path, monkeypatch):
    import json
    import os
    import stat

    import store
    from engine import lane_verdicts
    from loaders.loaded import LoadedModel

    monkeypatch.setenv("MLX_BACKEND_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    lm = LoadedModel(name="m", source=str(tmp_path / "model"), model=None, tokenizer=None, config={},
                     context_size=64, dtype="float32", options={}, load_seconds=0.0)
    config = EngineConfig()
    old = os.umask(0)
    try:
        lane_verdicts.write(lm, config, Lane(solo=True, reason="the batch differs"))
    finally:
        os.umask(old)
    (path,) = (tmp_path / "cache" / "lanes").glob("*.json")
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700 and stat.S_IMODE(path.stat().st_mode) == 0o600
    head, _, body = path.read_bytes().partition(b"\n")
    kept = json.loads(body)
    kept["solo"] = False  # a verdict that would put a solo-lane model in the batch
    path.write_bytes(head + b"\n" + json.dumps(kept).encode())
    before = store.figures()["lane_cache_corrupt"]
    assert lane_verdicts.read(lm, config) is None
    assert not path.exists() and store.figures()["lane_cache_corrupt"] == before + 1


def test_a_verdict_that_cannot_be_kept_is_a_miss_not_a_failure(tmp_path, monkeypatch):
    """The regression this store mends: a cache root that is a file failed every load."""
    import store
    from engine import lane_verdicts
    from loaders.loaded import LoadedModel

    (tmp_path / "root").write_text("a file where the cache root should be")
    monkeypatch.setenv("MLX_BACKEND_CACHE_DIR", str(tmp_path / "root"))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    lm = LoadedModel(name="m", source=str(tmp_path / "model"), model=None, tokenizer=None, config={},
                     context_size=64, dtype="float32", options={}, load_seconds=0.0)
    before = store.figures()["store_lanes_faults"]
    lane_verdicts.write(lm, EngineConfig(), Lane(solo=True, reason="r"))  # no exception
    assert lane_verdicts.read(lm, EngineConfig()) is None
    assert store.figures()["store_lanes_faults"] == before + 2


def test_a_failing_generation_step_fails_its_request_alone_and_the_lane_goes_on():
    from mlx_lm.models.cache import KVCache as Plain

    from engine.lanes.batch import Failed
    from engine.lanes.sampling import SamplingParams

    class Model:
        calls = 0

        def make_cache(self):
            return [Plain()]

        def __call__(self, inputs, cache=None):
            Model.calls += 1
            raise ValueError("the library raised")

    class Tokenizer:
        eos_token_ids = {2}

        def __len__(self):
            return 32

    class Loaded:
        model, tokenizer, epoch, kind = Model(), Tokenizer(), 1, "text"

    import mlx.core as mx

    lane = SoloBatch(Loaded(), prefill_step_size=4, prompt_cache_bytes=1 << 20, prompt_cache_entries=4,
                     stream=mx.default_stream(mx.default_device()))
    uid, cached, first = lane.admit([5, 6, 7], 4, SamplingParams(), [], False, on_error=lambda e: None)
    assert (cached, first) == (0, None)
    (failed,) = lane.step()
    assert isinstance(failed, Failed) and failed.uid == uid and "the library raised" in str(failed.error)
    assert Model.calls == 1
    assert lane.step() == [] and lane.remove([uid]) == {}
    # The lane takes the next request.
    assert lane.admit([5, 6], 4, SamplingParams(), [], False, on_error=lambda e: None)[0] != uid


# ---- the decision is returned, each run given the lane it tests -----------------------------


def _loaded_model(tmp_path):
    from loaders.loaded import LoadedModel

    class Model:  # a plain KV cache: nothing keeps it out of the batch
        def make_cache(self):
            return [KVCache()]

    (tmp_path / "model").mkdir(exist_ok=True)
    return LoadedModel(name="m", source=str(tmp_path / "model"), model=Model(), tokenizer=None, config={},
                       context_size=64, dtype="float32", options={}, load_seconds=0.0)


@pytest.mark.parametrize("forced, lane", [("solo", Lane(solo=True, reason="load option lane:solo")),
                                          ("batch", Lane(reason="load option lane:batch"))])
def test_a_lane_fixed_by_the_load_option_is_returned(tmp_path, forced, lane):
    from engine import lane_choice

    lm = _loaded_model(tmp_path)
    assert lane_choice.decide(lm, EngineConfig(), lambda: [], forced) == lane
    assert lm.lane == Lane()  # the model as loaded: LoadModel builds the served one with the lane


def test_a_trial_that_fails_in_the_batch_returns_the_solo_lane(tmp_path, monkeypatch):
    from engine import lane_choice, lane_probe, lane_verdicts

    lm = _loaded_model(tmp_path)
    tried, kept = [], []

    def run(model, lane, config, requests, stream, beat=None, together=lane_probe.TOGETHER, hooks=None):
        tried.append(lane)
        return [out([1]) if lane.solo else out([], error="INTERNAL: the batch raised")]

    monkeypatch.setattr(lane_probe, "run", run)
    monkeypatch.setattr(lane_verdicts, "write", lambda model, config, lane: kept.append(lane))
    requests = [Request(prompt=[1], max_tokens=1), Request(prompt=[2], max_tokens=1)]
    got = lane_choice.trial(lm, Lane(), EngineConfig(), requests, None, lambda: None, fallback=True)
    assert got == Lane(solo=True, reason="a request fails in the batch: INTERNAL: the batch raised")
    assert tried == [Lane(), got] and kept == [got] and lm.lane == Lane()
    assert lane_choice.trial(lm, got, EngineConfig(), requests, None, lambda: None, fallback=True) is got
    with pytest.raises(lane_choice.ModelLoadError, match="fails in the batch lane"):  # fixed by lane:batch
        lane_choice.trial(lm, Lane(), EngineConfig(), requests, None, lambda: None, fallback=False)


def test_a_verdict_is_of_the_lane_code_not_of_every_byte_of_the_backend(tmp_path):
    from engine import lane_verdicts

    for part in lane_verdicts.LANE_CODE + ("servicer.py", "engine/audio/jobs.py"):
        path = tmp_path / part / "a.py" if not part.endswith(".py") else tmp_path / part
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {part}\n")

    def digest():
        lane_verdicts.code_digest.cache_clear()
        return lane_verdicts.code_digest(tmp_path)

    before = digest()
    (tmp_path / "servicer.py").write_text("# another servicer\n")
    (tmp_path / "engine/audio/jobs.py").write_text("# other audio\n")
    assert digest() == before  # an upgrade elsewhere keeps every verdict
    (tmp_path / "engine/lanes/a.py").write_text("# another batch\n")
    changed = digest()
    assert changed != before
    (tmp_path / "engine/lane_tolerance.py").write_text("# another tolerance\n")
    assert digest() != changed
    lane_verdicts.code_digest.cache_clear()


def test_the_smallest_sliding_window_is_read_from_the_caches():
    from loaders.cache_kinds import window

    class Model:
        def __init__(self, *caches):
            self.caches = caches

        def make_cache(self):
            return list(self.caches)

    assert window(Model(KVCache(), KVCache())) is None
    assert window(Model(RotatingKVCache(max_size=64), KVCache(), RotatingKVCache(max_size=16))) == 16
    assert window(Model(CacheList(KVCache(), RotatingKVCache(max_size=8)))) == 8
