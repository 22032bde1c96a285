"""Media items of a request: base64 -> checked PIL images, and their content hashes.

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

MEDIA_MARKER = "<__media__>"  # where a raw Prompt puts each item (the host's default, reported back)


def b64_bytes(field: str, item: str) -> bytes:
    """The bytes of one base64 item (a `data:` prefix tolerated)."""
    data = item.split(",", 1)[1] if item.startswith("data:") else item
    try:
        raw = base64.b64decode("".join(data.split()), validate=True)
    except (binascii.Error, ValueError):
        raise OptionError(f"{field}: not valid base64") from None
    if not raw:
        raise OptionError(f"{field}: empty")
    return raw


def decode_image(field: str, raw: bytes, max_pixels: int):
    """An RGB PIL image, refused when it is not an image or has more than `max_pixels` pixels."""
    from PIL import Image, ImageOps

    try:
        with warnings.catch_warnings():
            # Our own bound replaces PIL's decompression-bomb warning.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(raw))
            width, height = img.size  # from the header: nothing decoded yet
            if width * height > max_pixels:
                raise OptionError(f"{field}: the image is {width}x{height}, over the bound of "
                                  f"{max_pixels} pixels (option max_image_pixels)")
            img.load()
            img = ImageOps.exif_transpose(img)
            return img.convert("RGB")
    except OptionError:
        raise
    except Exception as e:  # PIL raises many types for bytes that are not an image
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
