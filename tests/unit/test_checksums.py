"""The checksums of our cache files (loaders/checksums.py) and their private folders
(loaders/private_files.py): pure logic over bytes and modes, no model."""

import logging
import os
import stat

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders import checksums
from loaders.private_files import NotPrivate, open_private, private_dir, private_file

NOBODY = 65534
parts = st.lists(st.binary(max_size=64), max_size=6)


@given(parts)
def test_a_digest_is_a_function_of_its_parts(ps):
    assert checksums.digest(ps) == checksums.digest([bytes(p) for p in ps])
    assert checksums.digest(ps) == checksums.digest(memoryview(p) for p in ps)  # buffers as bytes


@given(parts, st.data())
def test_any_changed_byte_changes_the_digest(ps, data):
    ps = [p for p in ps if p] or [b"x"]
    i = data.draw(st.integers(0, len(ps) - 1))
    j = data.draw(st.integers(0, len(ps[i]) - 1))
    flipped = bytearray(ps[i])
    flipped[j] ^= data.draw(st.integers(1, 255))
    assert checksums.digest(ps[:i] + [bytes(flipped)] + ps[i + 1:]) != checksums.digest(ps)


@given(st.binary(min_size=1, max_size=64), st.binary(min_size=1, max_size=64))
def test_moving_bytes_between_parts_changes_the_digest(a, b):
    # The same concatenation, cut elsewhere: a name's last byte is not the array's first.
    assert checksums.digest([a + b[:1], b[1:]]) != checksums.digest([a, b])


@settings(max_examples=40)
@given(st.binary(max_size=4096), st.integers(1, 700))
def test_a_file_digest_is_the_hash_of_its_bytes_whatever_the_chunks(tmp_path_factory, data, chunk):
    path = tmp_path_factory.mktemp("digest") / "f"
    path.write_bytes(data)
    real = checksums._CHUNK
    checksums._CHUNK = chunk
    try:
        assert checksums.file_digest(path) == xxhash.xxh3_128(data).hexdigest()  # the library's own, at once
    finally:
        checksums._CHUNK = real


def test_a_damaged_file_is_counted_and_logged_once_with_its_path(caplog):
    before = checksums.figures()
    with caplog.at_level(logging.WARNING, logger="mlx-backend.checksums"):
        checksums.note_damaged(checksums.PROMPT_CACHE, "/some/file.safetensors", "flipped", "removed")
    after = checksums.figures()
    assert after[checksums.PROMPT_CACHE] == before[checksums.PROMPT_CACHE] + 1
    assert after[checksums.GGUF_CACHE] == before[checksums.GGUF_CACHE]
    assert [r.getMessage() for r in caplog.records] == [
        "prompt cache: /some/file.safetensors is damaged (flipped): removed"]


# ---- private folders and files ------------------------------------------------------


@pytest.fixture
def no_umask():
    old = os.umask(0)
    yield
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_folders_are_made_0700_with_their_missing_parents_whatever_the_umask(tmp_path, no_umask):
    tmp_path.chmod(0o755)
    target = tmp_path / "a" / "b" / "c"
    assert private_dir(target) == target
    assert [_mode(p) for p in (tmp_path / "a", tmp_path / "a" / "b", target)] == [0o700] * 3
    assert _mode(tmp_path) == 0o755  # an existing parent is not ours: left as it is
    os.umask(0o777)  # a umask that takes every bit: set afterwards all the same
    assert _mode(private_dir(tmp_path / "d")) == 0o700


def test_an_existing_folder_with_looser_modes_is_tightened(tmp_path):
    for mode in (0o777, 0o755, 0o750, 0o500):
        folder = tmp_path / oct(mode)
        folder.mkdir()
        folder.chmod(mode)
        private_dir(folder)
        assert _mode(folder) == 0o700


def test_a_file_where_a_folder_belongs_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError):
        private_dir(tmp_path / "f")
    with pytest.raises(OSError):
        private_dir(tmp_path / "f" / "below")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another user")
def test_a_folder_of_another_user_is_refused_and_left_alone(tmp_path):
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o755)
    os.chown(folder, NOBODY, NOBODY)
    with pytest.raises(NotPrivate, match=f"uid {NOBODY}"):
        private_dir(folder)
    st_ = os.stat(folder)
    assert (st_.st_uid, stat.S_IMODE(st_.st_mode)) == (NOBODY, 0o755)


def test_files_are_0600_whatever_the_umask(tmp_path, no_umask):
    path = tmp_path / "written"
    path.write_bytes(b"x")
    assert _mode(path) == 0o666
    private_file(path)
    assert _mode(path) == 0o600
    lock = tmp_path / "lock"
    os.close(open_private(lock))
    assert _mode(lock) == 0o600
    lock.chmod(0o644)  # an older lock file: tightened when opened
    os.close(open_private(lock))
    assert _mode(lock) == 0o600
