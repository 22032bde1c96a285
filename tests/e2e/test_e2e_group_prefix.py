"""End-to-end: a pipeline whose ranks hold shares of other sizes keeps one prefix cache across ranks.

Over 2 ranks with pipeline_split 4,2 rank 0 holds four of the six layers and rank 1 two: each
entry of the prefix cache weighs twice as much on rank 0. With a byte bound that holds one entry
on rank 0 (and would hold two on rank 1), a second prompt evicts the first on rank 0; a prompt
extending the first must then be prefilled whole on every rank. Were rank 1 to keep the entry
by its own bound, it would prefill only the extension, run other passes than rank 0, and the
ranks would wait on each other for ever. Every answer must equal one process's, in time.
"""

import pytest

from common.launcher import Backend, backend_pb2
from conftest import own_cache_root
from dist_support import RankGroup, tiny_model_dir

pytestmark = pytest.mark.e2e

ENV = {"MLX_BACKEND_RANK_TIMEOUT": "20"}
A = "alpha beta gamma " * 60
B = "one two three four " * 45  # about as long as A: an entry of about A's size
C = A + "and then the story goes on"
TIMEOUT = 90


def greedy(prompt: str):
    return backend_pb2.PredictOptions(Prompt=prompt, Tokens=8, Temperature=0.0, IgnoreEOS=True)


def test_an_entry_rank_0_evicts_is_evicted_on_every_rank(tmp_path, log_dir):
    model = tiny_model_dir(tmp_path / "model")
    single = Backend(log_path=str(log_dir / "group-prefix-single.log"))
    try:
        single.wait_healthy(120)
        assert single.load(model).success
        want = [single.stub.Predict(greedy(p), timeout=TIMEOUT).message for p in (A, B, C)]
    finally:
        single.stop()
    g = RankGroup(2, log_dir, env=dict(ENV, MLX_BACKEND_CACHE_DIR=own_cache_root()), log_name="group-prefix")
    try:
        g.wait_healthy(180)
        options = ["parallel:pipeline", "pipeline_split:4,2"]
        assert g.load(model, Options=options).success
        g.stub.Predict(greedy(A), timeout=TIMEOUT)
        entry = g.stub.Status(backend_pb2.HealthMessage(), timeout=30).memory.breakdown["prompt_cache"]
        assert entry > 0, "the first prompt's cache was not kept"
        # One entry fits rank 0's bound, two do not; on rank 1 (half the bytes) two would.
        loaded = g.load(model, Options=options + [f"prompt_cache_bytes:{entry * 3 // 2}"])
        assert loaded.success, loaded.message
        got = [g.stub.Predict(greedy(p), timeout=TIMEOUT).message for p in (A, B, C)]
        assert got == want
        said = g.stub.Status(backend_pb2.HealthMessage(), timeout=30).memory.breakdown
        assert said["prompt_cache"] <= entry * 3 // 2
        assert g.stub.Health(backend_pb2.HealthMessage(), timeout=10).message == b"OK"
    finally:
        g.stop()
