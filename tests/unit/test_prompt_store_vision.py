"""The prefix cache's disk tier for vision models (engine/prefix/cache_files.py, disk_tier.py), without a server.

A vision model's cache is keyed by the prompt with its media tokens replaced by
negative 64-bit content hashes (media.keyed_tokens), and its cache list ends with
a MediaState (loaders/vision_model.py). For each vision family served (tiny random
models, vision_fixture.py): the cache a real image prefill through the vision batch
leaves round-trips through the file format bit for bit, MediaState included, and runs
on to the same logits; the keyed tokens come back exactly, and a different image
never matches past its first media token.
"""

import pytest

mx = pytest.importorskip("mlx.core")

from mlx.utils import tree_flatten  # noqa: E402
import numpy as np  # noqa: E402

import backend_pb2  # noqa: E402
from engine.lanes.sampling import SamplingParams  # noqa: E402
from engine.lanes.vision_batch import VisionBatch  # noqa: E402
from engine.prefix import disk_tier  # noqa: E402
from engine.prefix.cache_files import decode_cache, encode_cache, fingerprint  # noqa: E402
from engine.prefix.disk_tier import DiskTier  # noqa: E402
from engine.prefix.prompt_store import PromptStore, make_store  # noqa: E402
from loaders.vision_model import MediaState  # noqa: E402
from prepare.media import MEDIA_MARKER  # noqa: E402
from vision_fixture import FAMILIES, image_b64, tiny_vision  # noqa: E402
from prepare.vision import vision_prompt  # noqa: E402

PROMPT = f"{MEDIA_MARKER}Describe this picture in one sentence."

_models = {}


def _model(family):
    from loaders.model_loader import LoadSpec, load

    if family not in _models:
        _models[family] = load(LoadSpec(model=tiny_vision(family)))
    return _models[family]


def _prepared(lm, seed=1, prompt=PROMPT):
    """(expanded prompt ids, media) of a raw prompt with one image, as preparation makes them."""
    _, ids, media = vision_prompt(lm, backend_pb2.PredictOptions(Prompt=prompt, Images=[image_b64(seed)]), [], {})
    return ids, media


def _batch(lm, **kw):
    return VisionBatch(lm, max_sequences=2, prefill_batch_size=1, prefill_step_size=16,
                       prompt_cache_bytes=1 << 30, prompt_cache_entries=4,
                       stream=mx.default_stream(mx.default_device()), **kw)


def _prefilled(lm, seed=1):
    """The cache a one-token request with an image leaves (its prefill in chunks of 16), and its key."""
    ids, media = _prepared(lm, seed)
    _, cached, first = _batch(lm).admit(ids, 1, SamplingParams(), [], False, _raise, direct=True, media=media)
    assert cached == 0 and first.finish_reason == "length"
    return first.prompt_cache, media.key


def _raise(e):
    raise e


def _leaves(cache):
    """Every leaf of every layer with its class, arrays as bytes; a MediaState as its deltas and keys."""
    out = []
    for i, layer in enumerate(cache):
        out.append((i, type(layer).__name__))
        if isinstance(layer, MediaState):
            out.append((i, layer.deltas, layer.keys))
            continue
        for path, v in tree_flatten(layer.state):
            out.append((i, path, (str(v.dtype), v.shape, np.array(v.view(mx.uint8)).tobytes())
                        if isinstance(v, mx.array) else v))
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_a_vision_cache_round_trips_bit_for_bit(family, tmp_path):
    lm = _model(family)
    cache, key = _prefilled(lm)
    assert isinstance(cache[-1], MediaState) and cache[-1].key == key
    assert min(key) < -(1 << 32)  # the image's tokens are keyed by a 62-bit hash
    if lm.model.mrope:  # positions after the image lag the cache offset
        assert cache[-1].delta != 0
    arrays, layers = encode_cache(cache)
    path = tmp_path / "entry.safetensors"
    mx.save_safetensors(str(path), arrays, {"layers": layers})
    loaded, meta = mx.load(str(path), return_metadata=True)
    back = decode_cache(loaded, meta["layers"])
    assert _leaves(back) == _leaves(cache)
    # The rebuilt cache runs on as the original does (the mRoPE delta from its MediaState).
    want = lm.model(mx.array([[5]]), cache=cache)
    got = lm.model(mx.array([[5]]), cache=back)
    assert mx.array_equal(want, got).item(), family


def test_keyed_tokens_come_back_exactly_and_another_image_never_matches(tmp_path):
    lm = _model(FAMILIES[0])
    cache, key = _prefilled(lm, seed=1)
    tier = DiskTier(tmp_path, fingerprint(lm), 1 << 30)
    assert tier.save(key, cache, "assistant")
    assert disk_tier.drain_all(30)
    fresh = DiskTier(tmp_path, fingerprint(lm), 1 << 30)  # a new process reading the folder
    best = fresh.best(key + [7], 0)
    assert best is not None and best[1] == len(key)
    tokens, back, _ = fresh.read(best[0])
    assert tokens == key and _leaves(back) == _leaves(cache)
    # Another image in the same prompt: the keys differ from its first media token on.
    _, other = _prepared(lm, seed=2)
    start = next(i for i, t in enumerate(key) if t < 0)
    assert other.key[:start] == key[:start] and other.key[start] != key[start]
    best = fresh.best(other.key, 0)
    assert best is not None and best[1] == start


def test_make_store_keeps_vision_models_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_BACKEND_PROMPT_CACHE_DIR", str(tmp_path))
    lm = _model(FAMILIES[0])
    store = make_store(lm, 4, 1 << 30, 1 << 30)
    assert isinstance(store, PromptStore) and store.disk is not None
    assert make_store(lm, 4, 1 << 30, 0).disk is None


def test_the_fingerprint_tells_vision_models_and_their_video_options_apart():
    from dataclasses import replace

    lm = _model(FAMILIES[0])
    base = fingerprint(lm)
    assert fingerprint(lm) == base
    assert fingerprint(_model(FAMILIES[1])) != base
    # Frame sampling changes what the same video bytes (the same key) put in the cache.
    other = replace(lm, vision=replace(lm.vision, extra={**lm.vision.extra, "fps": 0.5}))
    assert fingerprint(other) != base


def test_a_file_of_format_1_is_never_served(tmp_path):
    """Format 1 held int32 tokens. Its files sit under other fingerprints (the format is part of
    one); one found in a folder of this format is not served, and removed."""
    import base64

    lm = _model(FAMILIES[0])
    cache, key = _prefilled(lm)
    text = [t for t in key if t >= 0][:12]
    fp = fingerprint(lm)
    folder = tmp_path / fp
    folder.mkdir()
    arrays, layers = encode_cache(cache)
    old = base64.b64encode(np.asarray(text, dtype="<i4").tobytes()).decode("ascii")
    mx.save_safetensors(str(folder / "old.safetensors"), arrays,
                        {"format": "mlx-backend-prompt-cache/1", "fingerprint": fp, "tokens": old,
                         "trimmable": "1", "cache_type": "assistant", "layers": layers})
    assert DiskTier(tmp_path, fp, 1 << 30).best(text + [1], 0) is None
    assert not (folder / "old.safetensors").exists()
