"""End-to-end: what the vision families of the solo lane need beyond the zoo matrix's image
requests, through the real server.

- A family that keeps state on its modules between generations still gets mlx-vlm's own text in
  any order of requests: Falcon OCR's language model keeps the last image prompt's rope delta and
  applies it to a later prompt without an image; Falcon Perception keeps positions and an
  attention mask. Asked the same text before and after an image request (and after the load
  check's own image requests), the server gives the text of a freshly loaded model every time.
- A family whose prompt holds no image token (Nemotron-Parse: its encoder alone reads the page)
  takes a raw prompt's image marker as nothing, and a request without an image is refused as
  the request's fault (the library has nothing to decode from).

The oracle is mlx-vlm's own greedy `stream_generate` on a freshly loaded model, in this test
process.
"""

import base64
import io
import json

import grpc
import pytest

from common.launcher import backend_pb2, chat
from conftest import serving
from vision_fixture import image_b64
from vision_oracle import _greedy as greedy
from zoo import vision_builder

pytestmark = pytest.mark.e2e

TEXT = "Describe this."
N = 10
PICTURE = image_b64(1, (160, 120))


def library_greedy(model_dir: str, **media) -> list:
    """mlx-vlm's greedy tokens for TEXT on a freshly loaded model, up to its first step whose
    top-2 margin is too close to compare (the zoo oracle's rule)."""
    from mlx_vlm import load

    model, processor = load(model_dir)
    tokens = greedy(model, processor, TEXT, N, **media)
    assert len(tokens) >= 3, tokens  # enough certain steps for a comparison to mean something
    return tokens


def ids(reply) -> list:
    return [e["id"] for e in json.loads(reply.logprobs)["content"]]


def raw(prompt: str, **fields):
    return backend_pb2.PredictOptions(Prompt=prompt, Tokens=N, Temperature=0.0, Logprobs=1, **fields)


@pytest.mark.parametrize("family", ["falcon_ocr", "falcon_perception"])
def test_text_alone_gives_the_library_text_before_and_after_an_image(log_dir, family):
    model_dir = vision_builder.build(family)
    want = library_greedy(model_dir)
    for backend in serving(log_dir / f"solo-vision-{family}.log", model_dir):
        stub = backend.stub
        first = ids(stub.Predict(raw(TEXT), timeout=300))
        pictured = ids(stub.Predict(chat(TEXT, Images=[PICTURE], Tokens=N, Temperature=0.0, Logprobs=1),
                                    timeout=300))
        again = ids(stub.Predict(raw(TEXT), timeout=300))
        assert pictured[:len(want)] != want  # the image request really ran something else in between
        assert first[:len(want)] == want, (first, want)
        assert again[:len(want)] == want, (again, want)


def test_an_encoder_only_image_takes_a_raw_marker_as_nothing_and_a_request_needs_one(log_dir):
    from PIL import Image

    model_dir = vision_builder.build("nemotron_parse")
    want = library_greedy(model_dir, image=[Image.open(io.BytesIO(base64.b64decode(PICTURE))).convert("RGB")])
    for backend in serving(log_dir / "solo-vision-nemotron_parse.log", model_dir):
        stub = backend.stub
        marked = ids(stub.Predict(raw("<__media__>" + TEXT, Images=[PICTURE]), timeout=300))
        assert marked[:len(want)] == want, (marked, want)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Predict(raw(TEXT), timeout=300)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Images" in refused.value.details() and "nemotron_parse" in refused.value.details()
