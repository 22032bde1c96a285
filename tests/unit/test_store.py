"""The store (store.py): checksums, private folders, atomic and verified entries, the bound per
kind, and every fault a miss. No model."""

import logging
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

import store
from disk_faults import tmpfs
from store import NotPrivate, private_dir

checksums = store  # the digests are the store's
BACKEND = Path(__file__).resolve().parents[2] / "backend"

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


def test_a_damaged_entry_is_counted_and_logged_with_its_path(caplog):
    before = store.figures()
    with caplog.at_level(logging.WARNING, logger="mlx-backend.store"):
        store.PROMPTS.damaged("/some/file.safetensors", "flipped", "removed")
    after = store.figures()
    assert after["prompt_cache_disk_corrupt"] == before["prompt_cache_disk_corrupt"] + 1
    assert after["gguf_cache_corrupt"] == before["gguf_cache_corrupt"]
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



# ---- kinds: entries kept, verified, bounded; every fault a miss ----------------------


@pytest.fixture
def root(tmp_path, monkeypatch):
    """A fresh store root for this test (the store reads it at every use)."""
    folder = tmp_path / "root"
    monkeypatch.setenv("MLX_BACKEND_CACHE_DIR", str(folder))
    monkeypatch.delenv("MLX_BACKEND_PROMPT_CACHE_DIR", raising=False)
    return folder


def _faults(kind) -> int:
    return store.figures()[f"store_{kind.name.replace('-', '_')}_faults"]


def test_a_small_entry_round_trips_private_whatever_the_umask(root, no_umask):
    assert store.LANES.save("a.json", b'{"x": 1}')
    assert store.LANES.load("a.json") == b'{"x": 1}'
    assert store.LANES.load("missing.json") is None
    paths = [root, *root.rglob("*")]
    assert {oct(_mode(p)) for p in paths if p.is_dir()} == {"0o700"}
    assert {oct(_mode(p)) for p in paths if p.is_file()} == {"0o600"}


@given(st.binary(min_size=1, max_size=200), st.data())
@settings(max_examples=30)
def test_any_flipped_byte_of_a_small_entry_is_a_counted_miss_and_removed(tmp_path_factory, payload, data):
    base = tmp_path_factory.mktemp("flip")
    kind = store.Kind("flip-test", "flip test", "flip_test_corrupt")
    before_root = os.environ.get("MLX_BACKEND_CACHE_DIR")
    os.environ["MLX_BACKEND_CACHE_DIR"] = str(base)
    try:
        assert kind.save("e", payload)
        path = base / "flip-test" / "e"
        raw = bytearray(path.read_bytes())
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] ^= data.draw(st.integers(1, 255))
        path.write_bytes(bytes(raw))
        before = store.figures()["flip_test_corrupt"]
        assert kind.load("e") is None
        assert store.figures()["flip_test_corrupt"] == before + 1 and not path.exists()
    finally:  # the run's own root comes back: later tests start servers from it
        if before_root is None:
            del os.environ["MLX_BACKEND_CACHE_DIR"]
        else:
            os.environ["MLX_BACKEND_CACHE_DIR"] = before_root


def test_a_root_that_is_a_file_is_a_miss_counted_and_logged_once(root, caplog):
    root.parent.mkdir(exist_ok=True)
    root.write_text("not a folder")
    before = _faults(store.LANES)
    with caplog.at_level(logging.WARNING, logger="mlx-backend.store"):
        assert not store.LANES.save("a.json", b"{}")
        assert not store.LANES.save("b.json", b"{}")
        assert store.LANES.load("a.json") is None
    assert _faults(store.LANES) == before + 3
    assert len(caplog.records) == 1 and "lane verdicts" in caplog.records[0].getMessage()
    made = store.GGUF.make_folder("k", {"m": 1}, lambda tmp: (tmp / "w").write_bytes(b"weights"))
    assert (made / "w").read_bytes() == b"weights"  # in scratch: the load goes on
    assert not str(made).startswith(str(root))
    assert root.read_text() == "not a folder"


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")
def test_a_read_only_root_serves_what_it_holds_and_writes_are_misses(root):
    with tmpfs(root, "size=1m,mode=0700"):
        assert store.LANES.save("kept.json", b"old")
        entry = store.GGUF.make_folder("k", {"m": 1}, lambda tmp: (tmp / "w").write_bytes(b"weights"))
        assert entry == root / "gguf" / "k"
        subprocess.run(["mount", "-o", "remount,ro", str(root)], check=True)
        before = _faults(store.LANES)
        assert not store.LANES.save("new.json", b"new")
        assert _faults(store.LANES) == before + 1
        assert store.LANES.load("kept.json") == b"old"
        assert store.GGUF.open_folder("k", {"m": 1}) == entry
        other = store.GGUF.make_folder("k2", {"m": 2}, lambda tmp: (tmp / "w").write_bytes(b"other"))
        assert (other / "w").read_bytes() == b"other" and not str(other).startswith(str(root))


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")
def test_a_full_disk_is_a_miss_and_leaves_nothing_behind(root):
    with tmpfs(root, "size=64k,mode=0700"):
        big = os.urandom(256 << 10)
        before = _faults(store.GGUF)
        made = store.GGUF.make_folder("k", {"m": 1}, lambda tmp: (tmp / "w").write_bytes(big))
        assert (made / "w").read_bytes() == big and not str(made).startswith(str(root))
        assert _faults(store.GGUF) == before + 1
        assert sorted(p.name for p in (root / "gguf").iterdir()) == []  # no temporary left, no entry
        assert not store.LANES.save("x.json", big)


def _tree(folder: Path, files: dict) -> None:
    for rel, data in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


names = st.sampled_from(["a", "b", "sub/c", "sub/d", "sub/deeper/e"])


@given(st.dictionaries(names, st.binary(max_size=40), min_size=1), st.data())
@settings(max_examples=40)
def test_a_sealed_folder_is_ok_until_any_entry_changes(tmp_path_factory, files, data):
    folder = tmp_path_factory.mktemp("sealed") / "entry"
    _tree(folder, files)
    store.seal(folder, {"source": 1})
    assert store.folder_state(folder, {"source": 1}) == ("ok", "")
    assert store.folder_state(folder, {"source": 2})[0] == "stale"
    rel = data.draw(st.sampled_from(sorted(files)))
    damage = data.draw(st.sampled_from(["flip", "cut", "add", "remove", "link"]))
    path = folder / rel
    if damage == "flip" and files[rel]:
        raw = bytearray(path.read_bytes())
        raw[data.draw(st.integers(0, len(raw) - 1))] ^= 1
        path.write_bytes(bytes(raw))
    elif damage == "cut" and files[rel]:
        path.write_bytes(path.read_bytes()[:-1])
    elif damage == "add":
        (folder / "extra.pth").write_text("import evil\n")
    elif damage == "remove":
        path.unlink()
    elif damage == "link":
        path.unlink()
        os.symlink("/etc/hostname", path)
    else:
        return  # nothing to flip or cut in an empty file
    assert store.folder_state(folder, {"source": 1})[0] == "damaged"


def test_a_kept_folder_is_copied_out_with_its_own_modes(tmp_path, no_umask):
    made = tmp_path / "made"
    (made / "bin").mkdir(parents=True)
    (made / "bin" / "tool").write_bytes(b"#!/bin/sh\n")
    (made / "bin" / "tool").chmod(0o755)
    (made / "lib.txt").write_bytes(b"x")
    (made / "lib.txt").chmod(0o644)
    os.symlink("tool", made / "bin" / "alias")
    made.chmod(0o755)
    kind = store.Kind("copy-test", "copy test", "copy_test_corrupt")
    entry = kind.make_folder("e", {"k": 1}, lambda tmp: _copy_tree(made, tmp), base=tmp_path / "kept")
    assert {oct(_mode(p)) for p in entry.rglob("*") if not p.is_symlink()} <= {"0o700", "0o600"}
    store.copy_out(entry, tmp_path / "out")
    out = tmp_path / "out"
    assert (_mode(out), _mode(out / "bin" / "tool"), _mode(out / "lib.txt")) == (0o755, 0o755, 0o644)
    assert os.readlink(out / "bin" / "alias") == "tool" and not (out / store.MANIFEST).exists()


def _copy_tree(src: Path, tmp: Path) -> None:
    import shutil

    tmp.rmdir()
    shutil.copytree(src, tmp, symlinks=True)


@given(st.lists(st.integers(0, 100), min_size=1, max_size=8), st.integers(0, 400), st.one_of(st.none(), st.integers(1, 8)))
@settings(max_examples=40)
def test_the_bound_removes_the_least_recently_used_first(tmp_path_factory, sizes, budget, max_entries):
    folder = tmp_path_factory.mktemp("bound")
    kind = store.Kind("bound-test", "bound test", "bound_test_corrupt", budget=budget, max_entries=max_entries)
    for i, size in enumerate(sizes):  # entry i used at time 1000 + i: oldest first
        (folder / f"e{i}").write_bytes(b"x" * size)
        os.utime(folder / f"e{i}", (1000 + i, 1000 + i))
    total, count = kind.keep_within(folder)
    # The oracle: the fewest oldest entries gone so that the rest fit both bounds.
    first = next(k for k in range(len(sizes) + 1)
                 if sum(sizes[k:]) <= budget and (max_entries is None or len(sizes) - k <= max_entries))
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"e{i}" for i in range(first, len(sizes)))
    assert (total, count) == (sum(sizes[first:]), len(sizes) - first)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_temporary_leftovers_of_dead_processes_are_swept_and_live_ones_kept(tmp_path):
    host = os.uname().nodename.replace("-", "_") or "host"
    dead = tmp_path / f"{store.TMP}{host}-{_dead_pid()}-0a0b0c0d-entry"
    live = tmp_path / f"{store.TMP}{host}-{os.getpid()}-0d0c0b0a-entry"
    foreign = tmp_path / f"{store.TMP}elsewhere-1-00000000-entry"  # another host's: by age only
    old_foreign = tmp_path / f"{store.TMP}elsewhere-2-00000000-entry"
    for d in (dead, live, foreign, old_foreign):
        d.mkdir()
        (d / "w").write_bytes(b"\0" * 8)
    long_ago = time.time() - 3 * 24 * 3600
    os.utime(old_foreign, (long_ago, long_ago))
    store.Kind("sweep-test", "sweep test", "sweep_test_corrupt").keep_within(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {live.name, foreign.name}


WRITER = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, sys.argv[1])
    import store
    os.environ["MLX_BACKEND_CACHE_DIR"] = sys.argv[2]
    me = sys.argv[3].encode()
    for i in range(200):
        assert store.LANES.save("shared.json", me * (1 + i % 50))
""")


def test_two_processes_writing_one_entry_never_show_a_torn_one(root):
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(BACKEND), str(root), me]) for me in "ab"]
    seen, before = set(), store.figures()["lane_cache_corrupt"]
    while any(p.poll() is None for p in procs):
        got = store.LANES.load("shared.json")
        if got is not None:
            assert set(got) <= {ord("a"), ord("b")} and len(set(got)) == 1  # one writer's whole payload
            seen.add(got[:1])
    assert [p.wait() for p in procs] == [0, 0]
    assert store.figures()["lane_cache_corrupt"] == before
    assert not [p.name for p in (root / "lanes").iterdir() if p.name.startswith(store.TMP)]
