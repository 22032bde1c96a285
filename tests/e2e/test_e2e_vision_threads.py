"""End-to-end: what a vision model's load computes on the loading thread serves on the engine thread.

mlx-vlm keeps some arrays across calls in module-level lru_caches keyed by sizes (interpolate.py's
resize tables, which LFM2-VL's vision tower uses to fit its position embeddings to each image's
grid). The load builds a test image's embedding step on the loading thread; left unevaluated, the
tables it cached there stay bound to that thread's stream, and the first engine-thread request of
the same grid (the lane trial's probe picture is the test image's size) fails with "There is no
Stream(cpu, N) in current thread". The lane check on the loading thread runs a picture of that
size and so evaluated them there, hiding it; the failure came when the check was skipped: a lane
forced by the load option (here, in a fresh process: deterministic), or a verdict kept from an
earlier load of the same model by the same code (engine/lane_verdicts.py), which is why the
vision matrix failed on LFM2-VL only when run twice without a code change in between.
"""

import json

import pytest

from common.launcher import Backend, chat
from vision_fixture import image_b64
from vision_oracle import job, start

pytestmark = pytest.mark.e2e

QUESTION = "Describe this."
PICTURE = (1, 64, 64)  # the load's test image's size: the grid whose tables it cached
N = 8


@pytest.fixture(scope="module")
def lfm2_vl():
    from zoo import vision_builder

    path = vision_builder.build("lfm2_vl")
    answers = start([job(path, QUESTION, [PICTURE], N)])
    yield path, answers
    answers.close()


@pytest.fixture(scope="module")
def backend(log_dir, tmp_path_factory):
    # A fresh process (no table cached yet) and a cache folder of its own (no kept lane verdict).
    env = {"MLX_BACKEND_CACHE_DIR": str(tmp_path_factory.mktemp("vision-threads-cache"))}
    started = Backend(env=env, log_path=str(log_dir / "vision-threads.log"))
    try:
        started.wait_healthy()
        yield started
    finally:
        started.stop()


@pytest.mark.parametrize("lane", ["lane:batch", "lane:solo"])
def test_a_forced_lane_serves_the_library_text_at_the_test_image_size(backend, lfm2_vl, lane):
    path, answers = lfm2_vl
    want = answers.answer(0)
    assert not want["error"], want["error"]
    loaded = backend.load(path, Options=[lane])
    assert loaded.success, loaded.message
    seed, width, height = PICTURE
    reply = backend.stub.Predict(chat(QUESTION, Images=[image_b64(seed, (width, height))], Logprobs=1,
                                      Tokens=N, Temperature=0.0), timeout=300)
    got = [e["id"] for e in json.loads(reply.logprobs)["content"]]
    assert want["images"][0] and got[:len(want["images"][0])] == want["images"][0]
