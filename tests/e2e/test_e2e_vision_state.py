"""End-to-end: a vision family that keeps state on its modules between generations still gets
mlx-vlm's own text in any order of requests.

Falcon OCR's language model keeps the last image prompt's rope delta and applies it to a later
prompt without an image; Falcon Perception keeps positions and an attention mask. Both run in
the solo lane. The oracle is mlx-vlm's own greedy `stream_generate` of the text alone on a
freshly loaded model, in this test process; the server, asked the same text before and after
an image request (and after the load check's own image requests), gives it every time.
"""

import json

import pytest

from common.launcher import backend_pb2, chat
from conftest import serving
from vision_fixture import image_b64
from zoo import vision_builder

pytestmark = pytest.mark.e2e

TEXT = "Describe this."
N = 10
MARGIN = 1e-3  # steps past a closer top-2 are not compared (float rounding may pick either)


def library_text_alone(model_dir: str) -> list:
    import mlx.core as mx
    from mlx_vlm import load, stream_generate

    model, processor = load(model_dir)
    tokens = []
    for r in stream_generate(model, processor, TEXT, max_tokens=N, temperature=0.0):
        top2 = sorted(mx.topk(r.logprobs.reshape(-1), 2).tolist())
        if top2[1] - top2[0] < MARGIN:
            break
        tokens.append(r.token)
    return tokens[:N]


def ids(reply) -> list:
    return [e["id"] for e in json.loads(reply.logprobs)["content"]]


@pytest.mark.parametrize("family", ["falcon_ocr", "falcon_perception"])
def test_text_alone_gives_the_library_text_before_and_after_an_image(log_dir, family):
    model_dir = vision_builder.build(family)
    want = library_text_alone(model_dir)
    assert len(want) >= 3, want  # enough certain steps for the comparison to mean something
    text = backend_pb2.PredictOptions(Prompt=TEXT, Tokens=N, Temperature=0.0, Logprobs=1)
    for backend in serving(log_dir / f"state-{family}.log", model_dir):
        stub = backend.stub
        first = ids(stub.Predict(text, timeout=300))
        pictured = ids(stub.Predict(chat(TEXT, Images=[image_b64(1, (160, 120))], Tokens=N, Temperature=0.0,
                                         Logprobs=1), timeout=300))
        again = ids(stub.Predict(text, timeout=300))
        assert pictured[:len(want)] != want  # the image request really ran something else in between
        assert first[:len(want)] == want, (first, want)
        assert again[:len(want)] == want, (again, want)
