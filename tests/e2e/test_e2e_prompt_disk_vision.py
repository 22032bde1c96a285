"""End-to-end: a vision model's prefix cache outlives the process (engine/prefix/disk_tier.py).

A first server serves a raw prompt with an image (tiny random vision models,
vision_fixture.py) and is stopped with SIGTERM; a second server, on the same
models and folders, serves a longer prompt with the same image: the image and
the text before it come from the first server's files (the log's cached count
goes past the image), with the greedy tokens and logprobs of a cold run (the
disk tier off). The same prompt with another image matches only the text
before the image.
"""

import json

import pytest

from common.launcher import backend_pb2
from conftest import after_restart
from prepare.media import MEDIA_MARKER
from test_e2e_prompt_disk import cached_tokens
from vision_fixture import image_b64, tiny_vision

pytestmark = pytest.mark.e2e

FAMILIES = ["qwen2_vl", "idefics3"]  # with multimodal RoPE (a delta in its MediaState) and without
TOKENS = 8
BEFORE = "Look at this: "
FIRST = f"{BEFORE}{MEDIA_MARKER} What is in this picture?"
SECOND = FIRST + " Describe the image in one sentence."


def _load(backend, family, **fields):
    result = backend.load(tiny_vision(family), **fields)
    assert result.success, result.message


def _predict(backend, prompt, seed, label, tokens=TOKENS):
    o = backend_pb2.PredictOptions(Prompt=prompt, Images=[image_b64(seed)], Tokens=tokens, CorrelationId=label,
                                   Logprobs=1)
    return backend.stub.Predict(o, timeout=120)


def _keys(family):
    """The media-keyed prompts of FIRST and SECOND with image 1, as preparation makes them."""
    from loaders.model_loader import LoadSpec, load
    from prepare.vision import vision_prompt

    lm = load(LoadSpec(model=tiny_vision(family)))
    return [vision_prompt(lm, backend_pb2.PredictOptions(Prompt=p, Images=[image_b64(1)]), [], {})[2].key
            for p in (FIRST, SECOND)]


@pytest.fixture(scope="module")
def restarted(tmp_path_factory, log_dir):
    """The second server, after the first served FIRST with image 1 for every family and was stopped."""
    def first_work(first):
        for family in FAMILIES:
            _load(first, family)  # a swap keeps the previous family's entries on disk
            _predict(first, FIRST, 1, f"{family}-first", tokens=1)

    yield from after_restart(tmp_path_factory.mktemp("vision-cache"), log_dir, "vision-disk", first_work)


def _ids_and_logprobs(reply):
    content = json.loads(reply.logprobs)["content"]
    return [e["id"] for e in content], [e["logprob"] for e in content]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_restarted_server_serves_an_image_prompt_from_disk(restarted, family):
    backend, log = restarted
    first, second = _keys(family)
    assert second[:len(first)] == first  # SECOND's tokens begin with FIRST's, image included
    before = next(i for i, t in enumerate(first) if t < 0)  # the tokens before the image's first
    _load(backend, family)
    # Another image: the first server's file serves only the text before it (with the marker
    # tokens that open an image block, e.g. Qwen-VL's <|vision_start|>).
    _predict(backend, SECOND, 2, f"{family}-other-image")
    assert cached_tokens(log, f"{family}-other-image") == before
    # The same image: the file serves the whole of FIRST, the image and the text after it.
    warm = _predict(backend, SECOND, 1, f"{family}-warm")
    assert cached_tokens(log, f"{family}-warm") == len(first)
    _load(backend, family, Options=["prompt_cache_disk_bytes:0"])  # no disk tier: cold
    cold = _predict(backend, SECOND, 1, f"{family}-cold")
    assert cached_tokens(log, f"{family}-cold") == 0
    assert warm.message == cold.message
    (warm_ids, warm_lp), (cold_ids, cold_lp) = _ids_and_logprobs(warm), _ids_and_logprobs(cold)
    assert warm_ids == cold_ids and len(warm_ids) == TOKENS
    assert warm_lp == pytest.approx(cold_lp, abs=1e-4)
