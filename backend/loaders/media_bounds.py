"""What one request's media may cost: counts, payload bytes and decoded pixels.

Parsed and range-checked once, in LoadModel (`from_load`); checked per request
on the preparation thread from what is known before any decoding: the item
counts, the base64 lengths, and each image's or video's header (PIL and
OpenCV read the size without decoding). Pure Python, no PIL or MLX here.

Codes: a count over the host's per-prompt limit is INVALID_ARGUMENT (the
request breaks a rule of this model's configuration, as vLLM answers 400);
payload bytes and decoded pixels over their budget are RESOURCE_EXHAUSTED
(`OverBudget`): the work is too large for this server, as a prompt longer
than the context is.
"""

from dataclasses import dataclass
from typing import Any, Dict, Iterable, Sequence

from common.python_utils import OptionError, option_int

# Formats PIL may open: raster decoders only. Anything else (EPS and PostScript
# would reach Ghostscript, PDF, ICNS, ...) is refused before a decoder runs.
RASTER_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")


class OverBudget(OptionError):
    """Media over a size budget of this server: RESOURCE_EXHAUSTED, naming the bound."""


@dataclass(frozen=True)
class MediaBounds:
    max_images: int = 16  # per request (ModelOptions.LimitImagePerPrompt, option max_images)
    max_videos: int = 4  # (LimitVideoPerPrompt, max_videos)
    max_audios: int = 4  # (LimitAudioPerPrompt, max_audios)
    max_media_bytes: int = 32 << 20  # decoded base64 bytes of all items of a request (gRPC caps a message at 64 MiB)
    max_image_pixels: int = 4096 * 4096  # one image, or one video frame (width x height)
    max_request_pixels: int = 1 << 27  # every decoded image and video frame of a request together
    max_video_frames: int = 64  # frames sampled from one video at most


# (field of the bound, host's ModelOptions field or None, option name, minimum)
_FIELDS = (
    ("max_images", "LimitImagePerPrompt", 0),
    ("max_videos", "LimitVideoPerPrompt", 0),
    ("max_audios", "LimitAudioPerPrompt", 0),
    ("max_media_bytes", None, 1),
    ("max_image_pixels", None, 1),
    ("max_request_pixels", None, 1),
    ("max_video_frames", None, 2),
)
_HOST_FIELD = {name: host for name, host, _ in _FIELDS if host}


HOST_FIELDS = tuple(_HOST_FIELD.values())  # the ModelOptions fields `from_load` reads


def from_load(options: Dict[str, Any], limits: Dict[str, int]) -> MediaBounds:
    """The bounds of a LoadModel: the host's `Limit*PerPrompt` field when it is set (> 0),
    else the option of the same bound, else the default. `limits` maps the host's field
    names to their values. Raises OptionError naming the field or option."""
    d = MediaBounds()
    values = {}
    for name, host, minimum in _FIELDS:
        given = int(limits.get(host, 0)) if host else 0
        if given < 0:
            raise OptionError(f"{host}: must be >= 0 (0 = the default, {getattr(d, name)}), got {given}")
        values[name] = given or option_int(options, name, getattr(d, name), minimum=minimum)
    return MediaBounds(**values)


def _bound_name(name: str) -> str:
    host = _HOST_FIELD.get(name)
    return f"{host} / option {name}" if host else f"option {name}"


def check_counts(bounds: MediaBounds, images: int, videos: int, audios: int) -> None:
    for field, count, name in (("Images", images, "max_images"), ("Videos", videos, "max_videos"),
                               ("Audios", audios, "max_audios")):
        limit = getattr(bounds, name)
        if count > limit:
            raise OptionError(f"{field}: {count} items; at most {limit} per request ({_bound_name(name)})")


def payload_bytes(item: str) -> int:
    """An upper bound of the bytes a base64 item decodes to, without decoding it."""
    start = item.find(",") + 1 if item.startswith("data:") else 0
    return (len(item) - start) * 3 // 4


def check_bytes(bounds: MediaBounds, items: Iterable[tuple]) -> None:
    """`items`: (field, base64 text) pairs; their decoded bytes together within the budget."""
    total = 0
    for field, item in items:
        total += payload_bytes(item)
        if total > bounds.max_media_bytes:
            raise OverBudget(f"{field}: the media of this request reach {total} bytes, over the budget of "
                             f"{bounds.max_media_bytes} ({_bound_name('max_media_bytes')})")


@dataclass(frozen=True)
class Extent:
    """What decoding one item will produce, read from its header."""
    field: str
    width: int
    height: int
    frames: int = 1  # a video: the most frames its sampling can decode


def video_frames(bounds: MediaBounds, total_frames: int) -> int:
    """The most frames sampling decodes from a video of `total_frames` (it never takes more than either)."""
    return max(1, min(total_frames, bounds.max_video_frames))


def check_pixels(bounds: MediaBounds, extents: Sequence[Extent]) -> None:
    """Each frame within max_image_pixels (INVALID_ARGUMENT: no server could take it as it is),
    and all of them together within max_request_pixels (OverBudget), before anything is decoded."""
    total = 0
    for e in extents:
        pixels = e.width * e.height
        if pixels > bounds.max_image_pixels:
            what = "a frame of the video" if e.field.startswith("Videos") else "the image"
            raise OptionError(f"{e.field}: {what} is {e.width}x{e.height}, over the bound of "
                              f"{bounds.max_image_pixels} pixels (option max_image_pixels)")
        total += pixels * e.frames
        if total > bounds.max_request_pixels:
            raise OverBudget(f"{e.field}: the media of this request decode to {total} pixels or more, over the "
                             f"budget of {bounds.max_request_pixels} (option max_request_pixels)")
