"""The requests LoadModel runs before it answers: short greedy generations, prepared as a client's.

The check at load (engine/lane_choice.py) compares the lanes on these and then runs one of
them where requests run; each goes through the same preparation as a host's request (a raw
prompt for a text model; for a vision model a chat turn with a small image, through mlx-vlm's
templating and processor), then is made plain greedy, with end-of-sequence ignored so every
probe gives its PROBE_TOKENS tokens (more in a run of several: engine/lane_probe.py), and top-2
log-probabilities to judge near ties by.
Five prompts of different lengths (a batch pads the shorter ones); the first is repeated until
it passes the model's smallest sliding window by REACH_PAST tokens, where the context holds
that and the window is at most LONGEST: a batch whose rotating caches wrap otherwise than the
single stream's shows it there and nowhere shorter.
"""

import base64
import io

import backend_pb2
from engine.lanes.sampling import SamplingParams
from engine.requests import EngineError
from loaders import cache_kinds

from .text import build_request

PROBE_TOKENS = 3
REACH_PAST = 8  # tokens past the smallest sliding window the first probe's prompt ends at
LONGEST = 4096  # a window longer than this is not passed: each lane would prefill it, per probe run
TEXTS = (
    "The quick brown fox jumps over the lazy dog, then runs back across the wide field to the old red barn.",
    "Hello there",
    "One, two, three, four, five,",
    "Water boils at a temperature of",
    "def add(a, b):\n    return",
)


def probe_requests(lm) -> list:
    """Fresh engine Requests of the probes for loaded model `lm` (preparation or loading thread)."""
    image = _image_b64() if lm.serves.media else None
    out = [_request(lm, text, f"load check {'ABCDE'[i]}", image) for i, text in enumerate(TEXTS)]
    window = cache_kinds.window(lm.model)
    reach = None if window is None else window + REACH_PAST
    if reach is not None and window <= LONGEST and len(out[0].prompt) < reach < lm.context_size - PROBE_TOKENS:
        # Repeat the first text until the prompt passes the window; kept as written if the
        # context cannot hold that (the model's context is then about its own window).
        try:
            twice = _request(lm, " ".join([TEXTS[0]] * 2), "load check A", image)
            each = max(1, len(twice.prompt) - len(out[0].prompt))  # the tokens one more copy adds
            copies = 2 + -(-(reach - len(twice.prompt)) // each)
            longer = _request(lm, " ".join([TEXTS[0]] * copies), "load check A", image)
        except EngineError:  # past the context after all
            return out
        if len(longer.prompt) + PROBE_TOKENS < lm.context_size:
            out[0] = longer
    return out


def _request(lm, text: str, label: str, image):
    opts = backend_pb2.PredictOptions(Tokens=PROBE_TOKENS, IgnoreEOS=True, Logprobs=1, TopLogprobs=2,
                                      CorrelationId=label)
    if image is None:
        opts.Prompt = text
    else:  # one image in a chat turn, as mlx-vlm's own chat template places it
        opts.UseTokenizerTemplate = True
        opts.Messages.append(backend_pb2.Message(role="user", content=text))
        opts.Images.append(image)
    request = build_request(lm, opts)
    request.sampling = SamplingParams()  # greedy, whatever the model's load options default to
    return request


def _image_b64() -> str:
    """A small deterministic picture (a colour gradient with a square), as PNG in base64."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (64, 64))
    image.putdata([(4 * x, 4 * y, 128) for y in range(64) for x in range(64)])
    ImageDraw.Draw(image).rectangle((16, 16, 40, 40), fill=(250, 200, 20))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()
