"""End-to-end: a hostile client's media against the tiny Qwen2-VL through the real server.

Each case is refused with a clear code naming the bound, well within the
deadline, with the server's resident high-water mark barely moving (nothing
was decoded), and an ordinary image request sent next to it is served.
"""

import base64
import io
import time

import grpc
import pytest

from common.launcher import backend_pb2, chat
from conftest import run_threads, serving
from peak_rss import peak_growth_mb
from vision_fixture import image_b64, tiny_qwen2_vl, video_b64

pytestmark = pytest.mark.e2e

INVALID = grpc.StatusCode.INVALID_ARGUMENT
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
PEAK_MB = 150  # resident growth allowed while one hostile request is refused
TIME_S = 20  # well under the 30 s a host gives a request


def bomb_b64() -> str:
    """A blank 4000x4000 1-bit PNG: about 2 KB on the wire, 48 MB as decoded RGB."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("1", (4000, 4000)).save(buf, format="PNG", optimize=True)
    return base64.b64encode(buf.getvalue()).decode()


def eps_b64() -> str:
    """An EPS file: PIL would open it and hand the decoding to Ghostscript."""
    return base64.b64encode(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 64 64\n"
                            b"newpath 0 0 moveto 64 64 lineto stroke showpage\n%%EOF\n").decode()


@pytest.fixture(scope="module")
def model_dir():
    return tiny_qwen2_vl()


@pytest.fixture(scope="module")
def default(log_dir, model_dir):
    """The vision model with every media bound at its default."""
    yield from serving(log_dir / "media-default.log", model_dir)


@pytest.fixture(scope="module")
def limited(log_dir, model_dir):
    """The host's per-prompt limits set, and a small pixel budget."""
    yield from serving(log_dir / "media-limited.log", model_dir, LimitImagePerPrompt=2, LimitVideoPerPrompt=1,
                       Options=["max_request_pixels:60000"])


def ordinary(stub):
    return stub.Predict(chat("Describe this.", Images=[image_b64(3)], Tokens=4, Temperature=0.0), timeout=120)


def refused(server, opts):
    """(code, details) of a refused request, checked to be fast and to cost little memory,
    with an ordinary image request sent at the same time served."""
    def hostile():
        t0 = time.monotonic()
        try:
            server.stub.Predict(opts, timeout=120)
        except grpc.RpcError as e:
            return e.code(), e.details(), time.monotonic() - t0
        return None, "served", time.monotonic() - t0

    (got, other), peak = peak_growth_mb(server.proc.pid, lambda: run_threads([hostile, lambda: ordinary(server.stub)]))
    code, details, took = got
    assert isinstance(other, backend_pb2.Reply) and other.tokens > 0, other
    assert took < TIME_S, f"refused after {took:.1f} s"
    assert peak < PEAK_MB, f"the server's resident memory rose {peak:.0f} MB ({code}: {details})"
    return code, details


def test_120_image_bomb_is_refused_by_count_before_any_decoding(default):
    code, details = refused(default, chat("Describe these.", Images=[bomb_b64()] * 120, Tokens=4))
    assert code == INVALID, details
    assert "Images: 120 items; at most 16 per request (LimitImagePerPrompt / option max_images)" in details


def test_bombs_within_the_count_are_refused_by_the_pixel_budget_from_their_headers(default):
    code, details = refused(default, chat("Describe these.", Images=[bomb_b64()] * 16, Tokens=4))
    assert code == EXHAUSTED, details
    assert "option max_request_pixels" in details and details.startswith("Images[")


def test_eps_never_reaches_a_decoder(default):
    code, details = refused(default, chat("Describe this.", Images=[eps_b64()], Tokens=4))
    assert code == INVALID, details
    assert "Images[0]: not a decodable image of a raster format" in details


def test_the_hosts_image_limit_is_honoured(limited):
    code, details = refused(limited, chat("Describe these.", Images=[image_b64(i) for i in range(3)], Tokens=4))
    assert code == INVALID
    assert "Images: 3 items; at most 2 per request (LimitImagePerPrompt" in details
    reply = limited.stub.Predict(chat("Describe these.", Images=[image_b64(1), image_b64(2)], Tokens=4),
                                 timeout=120)
    assert reply.prompt_tokens > 0


def test_the_hosts_video_limit_and_the_frames_budget(limited):
    code, details = refused(limited, chat("Describe.", Videos=[video_b64(1, frames=2), video_b64(2, frames=2)],
                                          Tokens=4))
    assert code == INVALID
    assert "Videos: 2 items; at most 1 per request (LimitVideoPerPrompt" in details
    # 8 frames of 112x84 decode to 75264 pixels: over the budget of 60000, known from the header.
    code, details = refused(limited, chat("Describe.", Videos=[video_b64(1, frames=8)], Tokens=4))
    assert code == EXHAUSTED
    assert details.startswith("Videos[0]: ") and "budget of 60000 (option max_request_pixels)" in details


def test_bad_limits_fail_the_load(log_dir, model_dir, default):
    for fields, name in ((dict(LimitImagePerPrompt=-1), "LimitImagePerPrompt"),
                         (dict(Options=["max_request_pixels:0"]), "max_request_pixels"),
                         (dict(Options=["max_images:lots"]), "max_images")):
        result = default.load(model_dir, **fields)
        assert not result.success and name in result.message, result.message
    assert ordinary(default.stub).tokens > 0  # the loaded model keeps serving
