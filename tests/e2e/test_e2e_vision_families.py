"""End-to-end: each vision family that mlx-vlm can build tiny gives mlx-vlm's own output.

Tiny random-weight models (vision_fixture.py) of the families below; the oracle
is mlx-vlm's `stream_generate`, greedy, run in a separate process
(vision_oracle.py). The server must give its tokens for an image alone and for
two images requested at once. LLaVA (mlx-vlm 0.7.10 cannot prepare its images with
the transformers installed here) and Gemma 3 (mlx-vlm prefills its image
prompts under a mask the batch does not reproduce) must be refused at
LoadModel with the reason. What each family supports: docs/model-families.md.
"""

import json

import pytest

from common.launcher import chat
from conftest import run_threads, serving
from vision_fixture import FAMILIES, image_b64, tiny_vision
from vision_oracle import run

pytestmark = pytest.mark.e2e

QUESTION = "Describe this."
N = 10


@pytest.fixture(scope="module")
def backend(log_dir):
    yield from serving(log_dir / "vision-families.log", tiny_vision(FAMILIES[0]))


def ids(reply):
    return [e["id"] for e in json.loads(reply.logprobs)["content"]]


def ask(stub, seed):
    return stub.Predict(chat(QUESTION, Images=[image_b64(seed)], Logprobs=1, Tokens=N, Temperature=0.0),
                        timeout=120)


@pytest.mark.parametrize("family", FAMILIES)
def test_vision_family_equals_mlx_vlm(backend, family):
    path = tiny_vision(family)
    result = backend.load(path)
    assert result.success, result.message
    want = run(path, QUESTION, [1, 2], N)
    assert want[0] != want[1] or not want[0], "the two images should give different text"
    alone = ids(ask(backend.stub, 1))
    assert alone[:len(want[0])] == want[0], (family, alone, want[0])
    both = run_threads([lambda: ask(backend.stub, 1), lambda: ask(backend.stub, 2)])
    for reply, expect in zip(both, want):
        assert not isinstance(reply, Exception), (family, reply)
        assert ids(reply)[:len(expect)] == expect, (family, ids(reply), expect)


REFUSED = {  # family: words its LoadModel message must hold
    # mlx-vlm 0.7.10's LLaVA processor passes text options to transformers' image processor,
    # which refuses them: mlx-vlm's own generation fails on every image too.
    "llava": ("processor", "padding"),
    # mlx-vlm prefills Gemma 3 image prompts under its own 4-D mask; the batch's prefill is
    # causal, and the text differed from mlx-vlm's by the 4th token.
    "gemma3": ("attention mask", "differ"),
}


@pytest.mark.parametrize("family", sorted(REFUSED))
def test_a_family_that_cannot_be_served_exactly_is_refused_at_load(backend, family):
    result = backend.load(tiny_vision(family))
    assert not result.success
    assert family in result.message and all(w in result.message for w in REFUSED[family]), result.message
    # The server keeps serving: a family that works loads and answers next.
    assert backend.load(tiny_vision("qwen2_vl")).success
    assert ids(ask(backend.stub, 1))
