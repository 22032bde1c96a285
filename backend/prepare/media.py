"""Media items of a request: base64 -> raster PIL images, and their content hashes.

Runs on the preparation thread; pure Python and PIL, no MLX. Every refusal is
an OptionError naming the field (`Images[1]: ...`), which the servicer turns
into INVALID_ARGUMENT.
"""

import base64
import binascii
import hashlib
import io
import warnings
from typing import List, Sequence

from common.python_utils import OptionError
from loaders.media_bounds import RASTER_FORMATS

MEDIA_MARKER = "<__media__>"  # where a raw Prompt puts each item (the host's default, reported back)


def _payload(item: str) -> str:
    """The base64 text of an item, after a `data:...,` prefix when it has one."""
    return item.split(",", 1)[1] if item.startswith("data:") else item


def _decode(field: str, data: str) -> bytes:
    """The one base64 decoding of this package: strict, a refusal names the field."""
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise OptionError(f"{field}: not valid base64") from None


def b64_bytes(field: str, item: str) -> bytes:
    """The bytes of one base64 item (a `data:` prefix and line breaks tolerated)."""
    raw = _decode(field, "".join(_payload(item).split()))
    if not raw:
        raise OptionError(f"{field}: empty")
    return raw


def refuse_for_text(spec) -> None:
    """A model that takes text only refuses a request's media (each item checked to be base64
    first, so a broken item is named as such)."""
    for name in ("Images", "Videos", "Audios"):
        for i, item in enumerate(spec.media(name)):
            _decode(f"{name}[{i}]", _payload(item))
        if spec.media(name):
            raise OptionError(f"{name}: the loaded model takes text only")


def open_image(field: str, raw: bytes):
    """A PIL image of a raster format, opened lazily: its size is known, nothing is decoded yet."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            # Our own bounds (media_bounds) replace PIL's decompression-bomb warning.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return Image.open(io.BytesIO(raw), formats=RASTER_FORMATS)
    except Exception as e:  # PIL raises many types for bytes that are not an image
        raise OptionError(f"{field}: not a decodable image of a raster format "
                          f"({', '.join(RASTER_FORMATS)}) ({type(e).__name__})") from None


def decode_image(field: str, img):
    """The RGB pixels of an image `open_image` gave, EXIF-rotated (its size already checked)."""
    from PIL import Image, ImageOps

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img.load()
            img = ImageOps.exif_transpose(img)
            return img.convert("RGB")
    except Exception as e:  # truncated or corrupt data behind a valid header
        raise OptionError(f"{field}: not a decodable image ({type(e).__name__})") from None


def content_hash(raw: bytes) -> int:
    """A 62-bit content hash of one item: equal bytes, equal hash."""
    return int.from_bytes(hashlib.sha256(raw).digest()[:8], "little") >> 2


def keyed_tokens(tokens: Sequence[int], media_ids: Sequence[int], hashes: List[int]) -> List[int]:
    """The prompt as the prefix cache sees it: each media token replaced by its item's hash.

    Token ids alone cannot tell two pictures apart (both are runs of the same
    placeholder id), so a cached prefix that holds an image must only match a
    prompt with the same image. The i-th run of media tokens takes the i-th
    hash (negative, so never a vocabulary id); when the runs do not pair one to
    one with the items, every media token takes the hash of them all.
    """
    media = set(media_ids)
    runs, prev = [], False
    for i, t in enumerate(tokens):
        if t in media and not prev:
            runs.append(i)
        prev = t in media
    if len(runs) == len(hashes):
        per_run = [-1 - h for h in hashes]
    else:
        combined = content_hash(b"".join(h.to_bytes(8, "little") for h in hashes))
        per_run = [-1 - combined] * len(runs)
    out, run, prev = [], -1, False
    for t in tokens:
        is_media = t in media
        if is_media and not prev:
            run += 1
        out.append(per_run[run] if is_media else t)
        prev = is_media
    return out
