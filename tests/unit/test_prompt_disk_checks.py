"""A prefix-cache file is served only as it was written (engine/prefix/file_checks.py, disk_tier.py),
and its folders and files are this user's alone; without a server.

The oracle for "as written" is the entry built again from its tokens (test_prompt_store's
`_entry`, deterministic) compared leaf by leaf, bit for bit."""

import logging
import os
import shutil
import stat
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

mx = pytest.importorskip("mlx.core")

from engine.prefix.disk_tier import DiskTier  # noqa: E402
from engine.prefix.file_checks import Damaged, read_header  # noqa: E402
from engine.prefix.prompt_store import make_store  # noqa: E402
import store  # noqa: E402
from test_prompt_store import _drain, _entry, _leaves, _lm  # noqa: E402

TOKENS = list(range(3, 21))
FP = "c" * 32


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """One entry's file as the writer wrote it: (its name, its bytes)."""
    root = tmp_path_factory.mktemp("written")
    tier = DiskTier(root, FP, 1 << 30)
    assert tier.save(TOKENS, _entry(TOKENS), "assistant")
    _drain()
    (path,) = tier.folder.glob("*.safetensors")
    return path.name, path.read_bytes()


def _served(root, name: str, data: bytes):
    """What a fresh process makes of `data` as the file `name`: (tokens, cache) or None."""
    folder = root / FP
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / name).write_bytes(data)
    tier = DiskTier(root, FP, 1 << 30)
    best = tier.best(TOKENS + [1], 0)
    got = tier.read(best[0]) if best is not None else None
    return None if got is None else got[:2]


def _header_end(data: bytes) -> int:
    return 8 + struct.unpack("<Q", data[:8])[0]


def test_an_intact_file_is_served_as_written(written, tmp_path):
    tokens, cache = _served(tmp_path, *written)
    assert tokens == TOKENS and _leaves(cache) == _leaves(_entry(TOKENS))


@pytest.fixture(scope="module")
def one_root(tmp_path_factory):
    return tmp_path_factory.mktemp("flips")  # one folder (and one writer thread) for every example


@settings(max_examples=150)
@given(st.data())
def test_any_flipped_byte_is_served_as_written_or_not_at_all(written, one_root, data):
    name, good = written
    at = data.draw(st.integers(0, len(good) - 1), label="byte")
    flipped = bytearray(good)
    flipped[at] ^= data.draw(st.integers(1, 255), label="mask")
    root = one_root
    before = store.figures()["prompt_cache_disk_corrupt"]
    got = _served(root, name, bytes(flipped))
    counted = store.figures()["prompt_cache_disk_corrupt"] - before
    if got is not None:  # (a header byte JSON reads the same, e.g. padding turned into a tab)
        assert got[0] == TOKENS and _leaves(got[1]) == _leaves(_entry(TOKENS))
        assert counted == 0
    else:
        assert not (root / FP / name).exists()  # removed
        assert counted <= 1  # (a flipped format string is another format: removed, not counted)
    if at >= _header_end(good):  # the arrays' bytes: never served
        assert got is None and counted == 1


def test_a_tensor_table_that_does_not_match_its_arrays_is_damaged(written, tmp_path):
    name, good = written
    end = _header_end(good)
    header = good[8:end]
    # The first array's shape claims one row more than its bytes hold (same header length).
    i = header.index(b'"shape":[1,')
    wrong = header[:i] + b'"shape":[2,' + header[i + len(b'"shape":[1,'):]
    path = tmp_path / name
    path.write_bytes(good[:8] + wrong + good[end:])
    with pytest.raises(Damaged, match="dtype and shape"):
        read_header(path)


def test_a_written_file_and_its_folders_are_this_users_alone_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        tier = DiskTier(tmp_path / "new" / "prompt-cache", FP, 1 << 30)
        assert tier.save(TOKENS, _entry(TOKENS), "assistant")
        _drain()
    finally:
        os.umask(old)
    (path,) = tier.folder.glob("*.safetensors")
    modes = [stat.S_IMODE(os.stat(p).st_mode) for p in (tmp_path / "new", tier.root, tier.folder, path)]
    assert modes == [0o700, 0o700, 0o700, 0o600]


def test_a_prompt_cache_path_that_is_a_file_leaves_the_cache_in_memory(tmp_path, monkeypatch, caplog):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("MLX_BACKEND_PROMPT_CACHE_DIR", str(tmp_path / "file"))
    before = store.figures()["store_prompt_cache_faults"]
    with caplog.at_level(logging.WARNING, logger="mlx-backend.store"):
        kept = make_store(_lm(tmp_path), 4, 1 << 30, 1 << 30)
    assert kept.disk is None
    assert (tmp_path / "file").read_text() == "x"
    assert store.figures()["store_prompt_cache_faults"] == before + 1
    # Logged once per cause in a process: the first test here to meet it sees the line.
    assert all(str(tmp_path / "file") in r.getMessage() for r in caplog.records)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another user")
def test_a_prompt_cache_folder_of_another_user_turns_the_tier_off(tmp_path, monkeypatch, caplog):
    root = tmp_path / "theirs"
    root.mkdir(mode=0o755)
    os.chown(root, 65534, 65534)
    monkeypatch.setenv("MLX_BACKEND_PROMPT_CACHE_DIR", str(root))
    before = store.figures()["store_prompt_cache_faults"]
    with caplog.at_level(logging.WARNING, logger="mlx-backend.store"):
        kept = make_store(_lm(tmp_path), 4, 1 << 30, 1 << 30)
    assert kept.disk is None and list(root.iterdir()) == []
    assert store.figures()["store_prompt_cache_faults"] == before + 1
    (line,) = [r.getMessage() for r in caplog.records]
    assert "uid 65534" in line and "MLX_BACKEND_PROMPT_CACHE_DIR" in line
