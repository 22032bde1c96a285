"""Gemma 3's prefill masks (engine/lanes/image_blocks.py) against the published rule, written
here pair by pair: over random prompts with image runs, every chunking and window."""

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.lanes import image_blocks

IMAGE = 7


def rule(ids, i, j, window):
    """May query i attend key j: earlier or the same image (a maximal run of image tokens), within the window."""
    def image_of(k):
        if ids[k] != IMAGE:
            return None
        start = k
        while start > 0 and ids[start - 1] == IMAGE:
            start -= 1
        return start
    ok = j <= i or (image_of(i) is not None and image_of(i) == image_of(j))
    return ok and (window is None or j > i - window)


prompts = st.lists(st.sampled_from([1, 2, 3, IMAGE, IMAGE, IMAGE]), min_size=1, max_size=24)


@settings(max_examples=200)
@given(prompts, st.data(), st.one_of(st.none(), st.integers(1, 8)))
def test_each_chunk_has_the_rule_s_masks(ids, data, window):
    block = image_blocks.blocks(ids, {IMAGE})
    start = 0
    while start < len(ids):
        step = data.draw(st.integers(1, len(ids)))
        end = image_blocks.chunk_end(block, start, step)
        assert start < end <= len(ids)
        assert end == len(ids) or ids[end] != IMAGE or ids[end - 1] != IMAGE  # never inside an image
        made = image_blocks.masks(block, start, end, window)
        for name, w in (("global", None), ("sliding", window)):
            if name not in made:
                assert window is None
                continue
            assert made[name].shape == (end - start, end)
            for i in range(start, end):
                for j in range(end):
                    assert bool(made[name][i - start, j]) == rule(ids, i, j, w), (ids, name, i, j)
        start = end


def test_text_alone_is_causal_and_only_image_queries_look_ahead():
    ids = [1, 2, IMAGE, IMAGE, 3, IMAGE, 4]
    block = image_blocks.blocks(ids, {IMAGE})
    assert block.tolist() == [-1, -1, 0, 0, -1, 1, -1]
    full = image_blocks.masks(block, 0, len(ids), None)["global"]
    ahead = {(i, j) for i in range(len(ids)) for j in range(len(ids)) if full[i, j] and j > i}
    assert ahead == {(2, 3)}  # the first image's first token sees its second; nothing else looks ahead
    assert not image_blocks.has_images(block, 0, 2) and image_blocks.has_images(block, 4, 6)
