"""Media helpers: base64 and image checks (a hand table), media-keyed prompts (properties)."""

import base64
import io
import itertools

import pytest
from hypothesis import given, strategies as st

from common.python_utils import OptionError
from prepare.media import b64_bytes, content_hash, decode_image, keyed_tokens, open_image
from vision_fixture import image_b64

MEDIA = 7  # the placeholder id in these tests


def png(size) -> bytes:
    return base64.b64decode(image_b64(0, size=size))


@pytest.mark.parametrize("item, error", [
    ("@@@", "Images[0]: not valid base64"),
    ("", "Images[0]: empty"),
    ("data:image/png;base64,", "Images[0]: empty"),
    ("aGVsbG8=", None),  # valid base64 ("hello")
    ("data:image/png;base64,aGVsbG8=", None),
])
def test_b64_bytes(item, error):
    if error is None:
        assert b64_bytes("Images[0]", item) == b"hello"
    else:
        with pytest.raises(OptionError, match=error.replace("[", r"\[").replace("]", r"\]")):
            b64_bytes("Images[0]", item)


def test_open_then_decode_image_table():
    img = open_image("Images[0]", png((40, 30)))
    assert img.size == (40, 30)  # from the header
    img = decode_image("Images[0]", img)
    assert img.size == (40, 30) and img.mode == "RGB"
    with pytest.raises(OptionError, match=r"Images\[1\]: not a decodable image"):
        open_image("Images[1]", b"GIF89a but not really")
    truncated = png((40, 30))[:60]
    with pytest.raises(OptionError, match="not a decodable image"):
        decode_image("Images[0]", open_image("Images[0]", truncated))


def test_only_raster_formats_are_opened():
    from PIL import Image

    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 4000 4000\nshowpage\n%%EOF\n"
    assert Image.open(io.BytesIO(eps)).format == "EPS"  # PIL would take it (and call Ghostscript to decode)
    with pytest.raises(OptionError, match=r"Images\[0\]: not a decodable image of a raster format"):
        open_image("Images[0]", eps)
    for fmt in ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF"):
        raw = base64.b64decode(image_b64(0, size=(8, 6), fmt=fmt))
        assert open_image("Images[0]", raw).format == fmt


def test_content_hash_tells_equal_from_different_bytes():
    assert content_hash(b"abc") == content_hash(b"abc")
    assert content_hash(b"abc") != content_hash(b"abd")
    assert 0 <= content_hash(b"x") < 2 ** 62


# Prompts: runs of text tokens (1..6) and media runs (MEDIA), with one hash per media run.
segments = st.lists(st.one_of(st.lists(st.integers(1, 6), min_size=1, max_size=4),
                              st.integers(1, 5).map(lambda n: [MEDIA] * n)), max_size=8)


def _runs(tokens):
    """Start index of each media run (written with groupby, unlike the code under test)."""
    starts, i = [], 0
    for is_media, group in itertools.groupby(tokens, key=lambda t: t == MEDIA):
        n = len(list(group))
        if is_media:
            starts.append(i)
        i += n
    return starts


@given(segments, st.data())
def test_keyed_tokens_keep_text_and_key_each_run_by_its_item(segs, data):
    tokens = [t for s in segs for t in s]
    starts = _runs(tokens)
    hashes = data.draw(st.lists(st.integers(0, 2 ** 62 - 1), min_size=len(starts), max_size=len(starts)))
    key = keyed_tokens(tokens, [MEDIA], hashes)
    assert len(key) == len(tokens)
    for t, k in zip(tokens, key):
        assert k == t if t != MEDIA else k < 0
    if not starts:
        return
    # Changing item j's content changes the key exactly from run j on: a cached prefix
    # stops before the first image that differs.
    j = data.draw(st.integers(0, len(starts) - 1))
    other = list(hashes)
    other[j] = (other[j] + 1) % 2 ** 62
    key2 = keyed_tokens(tokens, [MEDIA], other)
    common = next((i for i, (a, b) in enumerate(zip(key, key2)) if a != b), len(key))
    assert common == starts[j]


@given(segments)
def test_keyed_tokens_fall_back_to_one_hash_when_runs_and_items_do_not_pair(segs):
    tokens = [t for s in segs for t in s]
    n = len(_runs(tokens))
    a = keyed_tokens(tokens, [MEDIA], [1] * (n + 1))
    b = keyed_tokens(tokens, [MEDIA], [2] * (n + 1))
    media_keys = {k for t, k in zip(tokens, a) if t == MEDIA}
    assert len(media_keys) <= 1
    assert (a != b) == (n > 0)


# MediaState rides in the KV cache list through the batch's merges, filters, extensions
# and extractions: after any sequence of them, row i still carries its own delta and key.
rows = st.lists(st.tuples(st.integers(-500, 0), st.lists(st.integers(-9, 99), max_size=4)), min_size=1, max_size=5)


@given(rows, rows, st.data())
def test_media_state_rows_follow_their_requests(a, b, data):
    from loaders.vision_model import MediaState

    def single(row):
        s = MediaState()
        s.set(*row)
        return s

    batch = MediaState.merge([single(r) for r in a])
    batch.extend(MediaState.merge([single(r) for r in b]))
    expected = list(a) + list(b)
    keep = sorted(data.draw(st.sets(st.integers(0, len(expected) - 1))))
    batch.filter(keep)
    expected = [expected[i] for i in keep]
    assert list(zip(batch.deltas, batch.keys)) == [(d, list(k)) for d, k in expected]
    for i, (d, k) in enumerate(expected):
        one = batch.extract(i)
        assert (one.delta, one.key) == (d, list(k))
    assert batch.trim(3) == 3 and batch.nbytes == 0 and batch.is_trimmable()
