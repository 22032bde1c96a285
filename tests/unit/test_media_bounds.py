"""Media bounds: how LoadModel sets them (a hand table) and the checks made before decoding
(properties against sums written here another way)."""

import base64
import itertools

import pytest
from hypothesis import given, strategies as st

from common.python_utils import OptionError
from loaders.media_bounds import (Extent, MediaBounds, OverBudget, check_bytes, check_counts,
                                  check_pixels, from_load, payload_bytes, video_frames)

D = MediaBounds()


@pytest.mark.parametrize("options, limits, expect", [
    ({}, {}, D),
    ({}, {"LimitImagePerPrompt": 0, "LimitVideoPerPrompt": 0}, D),  # 0 = not set by the host
    ({}, {"LimitImagePerPrompt": 3, "LimitAudioPerPrompt": 1},
     MediaBounds(max_images=3, max_videos=D.max_videos, max_audios=1)),
    ({"max_images": 5, "max_videos": 0}, {}, MediaBounds(max_images=5, max_videos=0)),
    ({"max_images": 5}, {"LimitImagePerPrompt": 2}, MediaBounds(max_images=2)),  # the host's field first
    ({"max_request_pixels": 1000, "max_video_frames": 2, "max_media_bytes": 10, "max_image_pixels": 7}, {},
     MediaBounds(max_request_pixels=1000, max_video_frames=2, max_media_bytes=10, max_image_pixels=7)),
])
def test_from_load(options, limits, expect):
    assert from_load(options, limits) == expect


@pytest.mark.parametrize("options, limits, error", [
    ({}, {"LimitImagePerPrompt": -1}, "LimitImagePerPrompt: must be >= 0"),
    ({"max_images": -2}, {}, "max_images"),
    ({"max_images": "many"}, {}, "max_images"),
    ({"max_request_pixels": 0}, {}, "max_request_pixels"),
    ({"max_video_frames": 1}, {}, "max_video_frames"),
    ({"max_media_bytes": 1.5}, {}, "max_media_bytes"),
])
def test_from_load_refuses(options, limits, error):
    with pytest.raises(OptionError, match=error):
        from_load(options, limits)


def test_counts_name_the_field_and_the_bound():
    b = MediaBounds(max_images=2, max_videos=1, max_audios=0)
    check_counts(b, 2, 1, 0)
    for counts, msg in (((3, 0, 0), "Images: 3 items; at most 2 per request (LimitImagePerPrompt / option max_images)"),
                        ((0, 2, 0), "Videos: 2 items; at most 1 per request (LimitVideoPerPrompt"),
                        ((0, 0, 1), "Audios: 1 items; at most 0 per request (LimitAudioPerPrompt")):
        with pytest.raises(OptionError) as e:
            check_counts(b, *counts)
        assert not isinstance(e.value, OverBudget) and str(e.value).startswith(msg)


@given(st.binary(max_size=300), st.booleans(), st.booleans())
def test_payload_bytes_bounds_the_decoded_size_from_above_by_at_most_two(raw, prefixed, newlines):
    text = base64.b64encode(raw).decode()
    if newlines:  # whitespace only makes the bound looser
        text = "\n".join(text[i:i + 76] for i in range(0, len(text), 76))
    if prefixed:
        text = "data:image/png;base64," + text
    n = payload_bytes(text)
    assert n >= len(raw)
    if not newlines:
        assert n <= len(raw) + 2


@given(st.lists(st.integers(0, 50), max_size=8), st.integers(1, 200))
def test_check_bytes_refuses_exactly_when_the_sum_is_over(sizes, budget):
    items = [(f"Images[{i}]", base64.b64encode(b"x" * (3 * s)).decode()) for i, s in enumerate(sizes)]
    total = sum(3 * s for s in sizes)  # multiples of 3: base64 without padding, exact
    if total <= budget:
        check_bytes(MediaBounds(max_media_bytes=budget), items)
        return
    with pytest.raises(OverBudget) as e:
        check_bytes(MediaBounds(max_media_bytes=budget), items)
    first_over = next(i for i, t in enumerate(itertools.accumulate(3 * s for s in sizes)) if t > budget)
    assert str(e.value).startswith(f"Images[{first_over}]: ")
    assert f"budget of {budget} (option max_media_bytes)" in str(e.value)


extents = st.lists(st.tuples(st.integers(1, 300), st.integers(1, 300), st.integers(1, 5), st.booleans()), max_size=6)


@given(extents, st.integers(1, 90_000), st.integers(1, 400_000))
def test_check_pixels_refuses_the_first_item_that_breaks_a_bound(items, per_item, total_budget):
    es = [Extent(f"Videos[{i}]" if video else f"Images[{i}]", w, h, frames if video else 1)
          for i, (w, h, frames, video) in enumerate(items)]
    bounds = MediaBounds(max_image_pixels=per_item, max_request_pixels=total_budget)
    # The reference: walk the items, stop at the first that breaks either bound.
    expected, running = None, 0
    for e in es:
        if e.width * e.height > per_item:
            expected = (OptionError, e.field, "option max_image_pixels")
            break
        running += e.width * e.height * e.frames
        if running > total_budget:
            expected = (OverBudget, e.field, "option max_request_pixels")
            break
    if expected is None:
        check_pixels(bounds, es)
        return
    with pytest.raises(OptionError) as got:
        check_pixels(bounds, es)
    kind, field, bound = expected
    assert isinstance(got.value, OverBudget) == (kind is OverBudget)
    assert str(got.value).startswith(field + ": ") and bound in str(got.value)


@given(st.integers(1, 10_000), st.integers(2, 1000))
def test_video_frames_is_what_sampling_can_take_at_most(total, bound):
    n = video_frames(MediaBounds(max_video_frames=bound), total)
    assert n == min(total, bound) and 1 <= n <= bound
