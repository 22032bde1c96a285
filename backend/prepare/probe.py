"""The requests LoadModel runs before it answers: short greedy generations, prepared as a client's.

The check at load (engine/lane_choice.py) compares the lanes on these and then runs one of
them where requests run; each goes through the same preparation as a host's request (a raw
prompt for a text model; for a vision model a chat turn with a small image, through mlx-vlm's
templating and processor), then is made plain greedy, with end-of-sequence ignored so every
probe gives its PROBE_TOKENS tokens (more in a run of several: engine/lane_probe.py), and top-2
log-probabilities to judge near ties by.
Three prompts of different lengths: a batch pads the shorter ones.
"""

import base64
import io

import backend_pb2
from engine.lanes.sampling import SamplingParams

from .text import build_request

PROBE_TOKENS = 3
TEXTS = (
    "The quick brown fox jumps over the lazy dog, then runs back across the wide field to the old red barn.",
    "Hello there",
    "One, two, three, four, five,",
)


def probe_requests(lm) -> list:
    """Fresh engine Requests of the probes for loaded model `lm` (preparation or loading thread)."""
    image = _image_b64() if lm.serves.media else None
    out = []
    for i, text in enumerate(TEXTS):
        opts = backend_pb2.PredictOptions(Tokens=PROBE_TOKENS, IgnoreEOS=True, Logprobs=1, TopLogprobs=2,
                                          CorrelationId=f"load check {'ABC'[i]}")
        if image is None:
            opts.Prompt = text
        else:  # one image in a chat turn, as mlx-vlm's own chat template places it
            opts.UseTokenizerTemplate = True
            opts.Messages.append(backend_pb2.Message(role="user", content=text))
            opts.Images.append(image)
        request = build_request(lm, opts)
        request.sampling = SamplingParams()  # greedy, whatever the model's load options default to
        out.append(request)
    return out


def _image_b64() -> str:
    """A small deterministic picture (a colour gradient with a square), as PNG in base64."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (64, 64))
    image.putdata([(4 * x, 4 * y, 128) for y in range(64) for x in range(64)])
    ImageDraw.Draw(image).rectangle((16, 16, 40, 40), fill=(250, 200, 20))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()
