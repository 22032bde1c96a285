"""The GGUF conversion cache survives crashes, replaced sources, damaged files and concurrent
loaders, and no other user can read it."""

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from gguf_fixture import write_tiny_gguf

REPO = Path(__file__).resolve().parent.parent.parent


def _embeddings_in_gguf(path: str) -> np.ndarray:
    """The oracle: the tensor as gguf's own reader sees it in the source file."""
    from gguf import GGUFReader

    t = next(t for t in GGUFReader(path).tensors if t.name == "token_embd.weight")
    return np.array(t.data).reshape(tuple(int(d) for d in reversed(t.shape.tolist())))


def _embeddings_served(entry: Path) -> np.ndarray:
    import mlx.core as mx
    from mlx_lm import load

    model, _ = load(str(entry))
    return np.array(model.model.embed_tokens.weight.astype(mx.float32))


def test_a_torn_entry_is_rebuilt_and_loads(tmp_path):
    from loaders.gguf_loader import gguf_to_mlx_dir

    src = write_tiny_gguf(str(tmp_path / "m.gguf"))
    cache = tmp_path / "cache"
    entry = gguf_to_mlx_dir(src, cache)
    weights = entry / "model.safetensors"
    # A crash or a full disk after config.json was written: the weights are cut short.
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    entry = gguf_to_mlx_dir(src, cache)
    np.testing.assert_allclose(_embeddings_served(entry), _embeddings_in_gguf(src), rtol=1e-6)


def test_a_flipped_byte_in_the_converted_weights_is_converted_again(tmp_path):
    import store
    from loaders.gguf_loader import gguf_to_mlx_dir

    src = write_tiny_gguf(str(tmp_path / "m.gguf"))
    cache = tmp_path / "cache"
    weights = gguf_to_mlx_dir(src, cache) / "model.safetensors"
    clean = weights.read_bytes()
    data = bytearray(clean)
    data[len(data) - 7] ^= 0x10  # one bit of the last weight: same size, same mtime resolution
    weights.write_bytes(bytes(data))
    before = store.figures()["gguf_cache_corrupt"]
    entry = gguf_to_mlx_dir(src, cache)
    assert store.figures()["gguf_cache_corrupt"] == before + 1
    assert (entry / "model.safetensors").read_bytes() == clean
    np.testing.assert_allclose(_embeddings_served(entry), _embeddings_in_gguf(src), rtol=1e-6)


def test_an_entry_of_an_earlier_version_is_converted_again_not_counted_as_damaged(tmp_path):
    import store
    from loaders.gguf_loader import gguf_to_mlx_dir

    src = write_tiny_gguf(str(tmp_path / "m.gguf"))
    cache = tmp_path / "cache"
    entry = gguf_to_mlx_dir(src, cache)
    # What an earlier version left: its own record (COMPLETE), no manifest of the store's.
    (entry / store.MANIFEST).rename(entry / "COMPLETE")
    before = store.figures()["gguf_cache_corrupt"]
    entry = gguf_to_mlx_dir(src, cache)
    assert (entry / store.MANIFEST).exists() and not (entry / "COMPLETE").exists()
    assert store.figures()["gguf_cache_corrupt"] == before  # stale, not damaged


def test_every_path_of_the_cache_is_this_users_alone_whatever_the_umask(tmp_path):
    from loaders.gguf_loader import gguf_to_mlx_dir

    src = write_tiny_gguf(str(tmp_path / "m.gguf"))
    top = tmp_path / "home"
    old = os.umask(0)
    try:
        gguf_to_mlx_dir(src, top / "cache" / "gguf")
    finally:
        os.umask(old)
    paths = [top, *top.rglob("*")]
    assert len(paths) > 6  # the folders, the entry's files, its record and the lock
    loose = {str(p): oct(stat.S_IMODE(p.lstat().st_mode)) for p in paths
             if stat.S_IMODE(p.lstat().st_mode) != (0o700 if p.is_dir() else 0o600)}
    assert loose == {}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another user")
def test_a_cache_folder_of_another_user_is_left_alone_and_the_load_goes_on(tmp_path):
    import store
    from loaders.gguf_loader import gguf_to_mlx_dir

    src = write_tiny_gguf(str(tmp_path / "m.gguf"))
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chown(cache, 65534, 65534)
    before = store.figures()["store_gguf_faults"]
    entry = gguf_to_mlx_dir(src, cache)  # converted for this process alone
    assert not str(entry).startswith(str(cache)) and list(cache.iterdir()) == []
    assert store.figures()["store_gguf_faults"] > before
    np.testing.assert_allclose(_embeddings_served(entry), _embeddings_in_gguf(src), rtol=1e-6)


def test_a_source_replaced_with_the_same_size_and_mtime_is_converted_again(tmp_path):
    from loaders.gguf_loader import gguf_to_mlx_dir

    src = write_tiny_gguf(str(tmp_path / "m.gguf"), seed=0)
    other = write_tiny_gguf(str(tmp_path / "other.gguf"), seed=1)
    assert os.path.getsize(src) == os.path.getsize(other)
    cache = tmp_path / "cache"
    gguf_to_mlx_dir(src, cache)
    old = _embeddings_in_gguf(src)
    before = os.stat(src)
    # What `cp -p other m.gguf` does: the same inode rewritten, then the source's times put back.
    with open(src, "r+b") as f:
        f.write(Path(other).read_bytes())
    os.utime(src, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(src)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    got = _embeddings_served(gguf_to_mlx_dir(src, cache))
    np.testing.assert_allclose(got, _embeddings_in_gguf(other), rtol=1e-6)
    assert not np.allclose(got, old)


CONVERT_ONCE = textwrap.dedent("""
    import os, sys, time
    sys.path[:0] = [os.path.join(sys.argv[1], "backend"), sys.argv[1]]
    from loaders import gguf_loader

    src, cache, me, work = sys.argv[2:6]
    real_convert = gguf_loader.convert

    def counted(path, out_dir):
        with open(os.path.join(work, "conversions"), "a") as f:
            f.write(me + "\\n")
        time.sleep(1.5)  # holds the conversion open so the other process arrives during it
        real_convert(path, out_dir)

    gguf_loader.convert = counted
    open(os.path.join(work, "ready-" + me), "w").close()
    deadline = time.monotonic() + 60
    while not all(os.path.exists(os.path.join(work, "ready-" + n)) for n in "ab"):
        assert time.monotonic() < deadline, "the other process never started"
        time.sleep(0.01)
    print(gguf_loader.gguf_to_mlx_dir(src, cache))
""")


def test_two_processes_converting_the_same_file_convert_once(tmp_path):
    src = write_tiny_gguf(str(tmp_path / "m.gguf"))
    cache = tmp_path / "cache"
    procs = [subprocess.Popen([sys.executable, "-c", CONVERT_ONCE, str(REPO), src, str(cache), me, str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for me in "ab"]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    assert len((tmp_path / "conversions").read_text().split()) == 1
    entries = {o[0].strip() for o in outs}
    assert len(entries) == 1
    np.testing.assert_allclose(_embeddings_served(Path(entries.pop())), _embeddings_in_gguf(src), rtol=1e-6)
