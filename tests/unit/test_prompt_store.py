"""The prefix cache's disk tier (engine/prefix/prompt_store.py, disk_tier.py, cache_files.py), without a server: the file format
round-trips every cache kind bit for bit, torn files are skipped and removed, the byte
budget holds, two stores sharing a folder serve each other's files, and another model,
adapter scale, dtype or KV cache type never matches."""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from mlx.utils import tree_flatten  # noqa: E402
from mlx_lm.models.cache import CacheList, KVCache, RotatingKVCache, make_prompt_cache  # noqa: E402

from engine.prefix import disk_tier  # noqa: E402
from engine.prefix.cache_files import decode_cache, encode_cache, fingerprint  # noqa: E402
from engine.prefix.disk_tier import DiskTier  # noqa: E402
from engine.prefix.prompt_store import PromptStore  # noqa: E402
from family_models import FAMILIES, build  # noqa: E402
from engine.kv import kv_rows  # noqa: E402
from loaders.adapt_options import KVSpec  # noqa: E402

PROMPT = [5, 17, 301, 42, 42, 9, 77, 1000, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25]


def _load(family, kv=None):
    from mlx_lm import load

    model, _ = load(build(family))
    kv_rows.install(model, kv)
    return model


def _filled(model, tokens=PROMPT):
    cache = make_prompt_cache(model)
    model(mx.array([tokens]), cache=cache)  # a prefill chunk ...
    model(mx.array([[3]]), cache=cache)  # ... and a decode step
    mx.eval([c.state for c in cache])
    return cache


def _leaves(cache):
    """Every leaf of every layer's state with its path and class, for a bit-for-bit comparison."""
    out = []

    def walk(layer, where):
        out.append((where, type(layer).__name__))
        if isinstance(layer, CacheList):
            for i, c in enumerate(layer.caches):
                walk(c, f"{where}.{i}")
            return
        for path, v in tree_flatten(layer.state):
            out.append((f"{where}:{path}", ("array", str(v.dtype), v.shape, np.array(v.view(mx.uint8) if v.dtype != mx.bool_ else v).tobytes())
                        if isinstance(v, mx.array) else v))

    for i, layer in enumerate(cache):
        walk(layer, str(i))
    return out


def _round_trip(cache, tmp_path):
    arrays, layers = encode_cache(cache)
    path = tmp_path / "entry.safetensors"
    mx.save_safetensors(str(path), arrays, {"layers": layers})
    loaded, meta = mx.load(str(path), return_metadata=True)
    return decode_cache(loaded, meta["layers"])


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_cache_round_trips_bit_for_bit(family, tmp_path):
    model = _load(family)
    cache = _filled(model)
    back = _round_trip(cache, tmp_path)
    assert _leaves(back) == _leaves(cache)
    # And the rebuilt cache runs on: the next step's logits are those of the original.
    want = model(mx.array([[8]]), cache=cache)
    got = model(mx.array([[8]]), cache=back)
    assert mx.array_equal(want, got).item(), family


@pytest.mark.parametrize("kv", [KVSpec(bits=4), KVSpec(bits=8, group_size=32), KVSpec(dtype="float16"),
                                KVSpec(dtype="bfloat16")], ids=lambda k: k.describe())
def test_our_kv_cache_kinds_round_trip_bit_for_bit(kv, tmp_path):
    from mlx_lm.models import llama

    mx.random.seed(0)  # head dimension 64: quantization groups of 32 and 64 fit
    model = llama.Model(llama.ModelArgs(
        model_type="llama", hidden_size=128, num_hidden_layers=2, intermediate_size=64, num_attention_heads=2,
        num_key_value_heads=1, rms_norm_eps=1e-5, vocab_size=2048, tie_word_embeddings=False))
    mx.eval(model.parameters())
    kv_rows.install(model, kv)
    cache = _filled(model)
    assert {type(c).__name__ for c in cache} & {"QuantizedRow", "Float16Row", "Bfloat16Row"}
    back = _round_trip(cache, tmp_path)
    assert [type(c) for c in back] == [type(c) for c in cache]
    assert _leaves(back) == _leaves(cache)
    want = model(mx.array([[8]]), cache=cache)
    got = model(mx.array([[8]]), cache=back)
    assert mx.array_equal(want, got).item()


def test_a_cache_list_round_trips(tmp_path):
    kv, window = KVCache(), RotatingKVCache(max_size=4)
    x = mx.random.normal((1, 2, 6, 8))
    kv.update_and_fetch(x, x + 1)
    window.update_and_fetch(x, x * 2)
    cache = [CacheList(kv, window)]
    back = _round_trip(cache, tmp_path)
    assert isinstance(back[0], CacheList)
    assert _leaves(back) == _leaves(cache)


# ---- the disk tier --------------------------------------------------------------


def _lm(source, **kw):
    return SimpleNamespace(source=str(source), config={"model_type": "llama"}, dtype="float32", kind="text",
                           adapters=[], adapter_scales=[], kv=None, **kw)


def _entry(tokens, width=64):
    c = KVCache()
    x = mx.arange(len(tokens) * width, dtype=mx.float32).reshape(1, 1, len(tokens), width) + tokens[0]
    c.update_and_fetch(x, -x)
    c.keys, c.values = mx.array(c.keys[..., :len(tokens), :]), mx.array(c.values[..., :len(tokens), :])
    mx.eval(c.keys, c.values)
    return [c]


def _store(root, fp="m" * 32, budget=1 << 30, entries=2):
    return PromptStore(max_size=entries, max_bytes=1 << 40, disk=DiskTier(root, fp, budget))


def _drain():
    assert disk_tier.drain_all(30)


def test_evicted_entries_come_back_from_disk(tmp_path):
    store = _store(tmp_path)
    a, b, c = [1, 2, 3, 4, 5, 6], [7, 8, 9, 10], [11, 12, 13]
    for t in (a, b, c):  # two fit in memory: a goes to disk
        store.insert_cache(0, t, _entry(t))
    _drain()
    assert store.disk.entries == 1
    cache, rest = store.fetch_nearest_cache(0, a + [99, 100])
    assert rest == [99, 100]
    assert _leaves(cache) == _leaves(_entry(a))
    store.count_hit(len(a))
    assert store.figures()["prompt_cache_hits_disk"] == 1
    assert store.figures()["prompt_cache_tokens_saved"] == 6
    # A trimmable entry serves a prompt that shares only part of it.
    store.insert_cache(0, [50, 51], _entry([50, 51]))
    store.insert_cache(0, [60, 61], _entry([60, 61]))
    _drain()
    cache, rest = store.fetch_nearest_cache(0, [1, 2, 3, 40])
    assert rest == [40] and cache[0].offset == 3


def test_a_torn_file_is_skipped_and_removed(tmp_path):
    tier = DiskTier(tmp_path, "f" * 32, 1 << 30)
    tokens = list(range(1, 40))
    assert tier.save(tokens, _entry(tokens), "assistant")
    _drain()
    (path,) = list(tier.folder.glob("*.safetensors"))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])  # truncated: the arrays no longer fit
    fresh = DiskTier(tmp_path, "f" * 32, 1 << 30)  # a new process reading the folder
    assert fresh.best(tokens + [1], 0) is None
    assert not path.exists()
    # A file torn after this store indexed it: the read fails, the file goes, nothing is served.
    assert tier.save(tokens, _entry(tokens), "assistant")
    _drain()
    store = PromptStore(max_size=4, disk=DiskTier(tmp_path, "f" * 32, 1 << 30))
    path.write_bytes(path.read_bytes()[:200])
    cache, rest = store.fetch_nearest_cache(0, tokens + [1])
    assert cache is None and rest == tokens + [1]
    assert not path.exists()


def test_the_disk_budget_holds_over_200_prompts(tmp_path):
    one = sum(a.nbytes for a in encode_cache(_entry(list(range(30))))[0].values())
    budget = one * 12 + 5000
    store = _store(tmp_path, budget=budget, entries=1)
    for i in range(200):
        tokens = [1000 + i] + list(range(29))
        store.insert_cache(0, tokens, _entry(tokens))
        _drain()
        files = list(tmp_path.rglob("*.safetensors"))
        assert sum(f.stat().st_size for f in files) <= budget, i
    assert 8 <= len(files) <= 12
    # The most recent prompts are the ones kept.
    cache, rest = store.fetch_nearest_cache(0, [1000 + 198] + list(range(29)) + [5])
    assert cache is not None and rest == [5]


def test_two_stores_sharing_a_folder_serve_each_others_files(tmp_path):
    first, second = _store(tmp_path), _store(tmp_path)
    a, b = [1, 2, 3, 4, 5], [6, 7, 8, 9]
    first.insert_cache(0, a, _entry(a))
    second.insert_cache(0, b, _entry(b))
    assert first.flush_to_disk() == 1 and second.flush_to_disk() == 1
    _drain()
    cache, rest = second.fetch_nearest_cache(0, a + [10])
    assert rest == [10] and _leaves(cache) == _leaves(_entry(a))
    cache, rest = first.fetch_nearest_cache(0, b + [10])
    assert rest == [10] and _leaves(cache) == _leaves(_entry(b))


WRITER = """
import sys
sys.path[:0] = sys.argv[3:]
import mlx.core as mx
from mlx_lm.models.cache import KVCache
from engine.prefix import disk_tier
tier = disk_tier.DiskTier(__import__("pathlib").Path(sys.argv[1]), "p" * 32, 1 << 40)
for i in range(int(sys.argv[2])):
    tokens = [7, i % 5] + list(range(200))
    c = KVCache()
    x = mx.full((1, 2, len(tokens), 64), float(i % 5))
    c.update_and_fetch(x, x)
    c.keys, c.values = mx.array(x), mx.array(x)
    tier.save(tokens, [c], "assistant")
    disk_tier.drain_all(30)
"""


def test_two_processes_writing_one_folder_never_show_a_partial_file(tmp_path):
    """Two processes rewrite the same five entries over and over while this one reads them:
    every file it finds is whole and holds what its tokens say."""
    paths = [str(Path(__file__).parent.parent.parent / "backend"), str(Path(__file__).parent.parent.parent)]
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), "15", *paths]) for _ in range(2)]
    reader = DiskTier(tmp_path, "p" * 32, 1 << 40)
    seen, running = 0, True
    while running:
        running = any(p.poll() is None for p in procs)  # one more pass after both ended
        for k in range(5):
            best = reader.best([7, k] + list(range(200)) + [1], 0)
            if best is None:
                continue
            got = reader.read(best[0])
            assert got is not None  # a partial file would have been read (and removed) here
            tokens, cache, _ = got
            # (the longest match may be another entry, cut back to their shared first token)
            assert tokens[0] == 7 and mx.all(cache[0].keys == float(tokens[1])).item()
            seen += 1
    assert all(p.wait() == 0 for p in procs)
    assert seen > 0
    assert not list(tmp_path.rglob(".*tmp*"))  # no temporary file left behind


def test_another_model_adapter_dtype_or_kv_type_never_matches(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"x" * 10)
    other = tmp_path / "other"
    other.mkdir()
    (other / "model.safetensors").write_bytes(b"x" * 10)
    base = fingerprint(_lm(model))
    assert fingerprint(_lm(model)) == base  # stable
    variants = [
        _lm(other),
        SimpleNamespace(**{**vars(_lm(model)), "dtype": "float16"}),
        SimpleNamespace(**{**vars(_lm(model)), "kv": KVSpec(bits=4)}),
        SimpleNamespace(**{**vars(_lm(model)), "kv": KVSpec(bits=8)}),
        SimpleNamespace(**{**vars(_lm(model)), "kv": KVSpec(dtype="float16")}),
        SimpleNamespace(**{**vars(_lm(model)), "adapters": [str(other)], "adapter_scales": [1.0]}),
        SimpleNamespace(**{**vars(_lm(model)), "adapters": [str(other)], "adapter_scales": [0.5]}),
    ]
    prints = [fingerprint(v) for v in variants]
    assert len(set(prints + [base])) == len(prints) + 1
    # The weights changing in place (same directory) is another model too.
    os.utime(model / "model.safetensors", ns=(1, 1))
    assert fingerprint(_lm(model)) != base
    # And a file of one fingerprint is never served to a store of another.
    tokens = list(range(1, 20))
    root = tmp_path / "cache"
    DiskTier(root, base, 1 << 30).save(tokens, _entry(tokens), "assistant")
    _drain()
    for fp in prints:
        store = PromptStore(max_size=4, disk=DiskTier(root, fp, 1 << 30))
        assert store.fetch_nearest_cache(0, tokens + [1]) == (None, tokens + [1])
    assert PromptStore(max_size=4, disk=DiskTier(root, base, 1 << 30)).fetch_nearest_cache(0, tokens + [1])[1] == [1]
