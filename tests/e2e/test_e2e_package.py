"""End-to-end: `make package`'s artifact installed and started the way LocalAI does it.

From the docker-archive tar (LocalAI's `ocifile://`) and from the plain folder, into a fresh
backends folder whose path holds a space, with the build folder moved away, on a PATH with no
Python and with junk PYTHONHOME / PYTHONPATH: the artifact must run on its own interpreter.
LocalAI's install steps (core/gallery/backends.go): unpack into `<name>.install-tmp`, require
`run.sh` at its top, write metadata.json, rename into `<name>`.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from common import openblas
from common.launcher import REPO, backend_pb2, chat
from localai_host import kill_group, start_like_localai, stop_like_localai, wait_healthy_like_the_host

pytestmark = pytest.mark.e2e

HOST_TOOLS = ("sh", "env", "uname", "cat", "ls")  # what a LocalAI host's PATH has, less any Python
JUNK = "/nonexistent/python-settings-of-the-host"


@pytest.fixture(scope="module")
def package():
    """(tree, tar) of `make package`'s build; built once, reused while its inputs are the same."""
    out = subprocess.run([sys.executable, str(Path(REPO) / "bundle" / "build.py")], check=True,
                         stdout=subprocess.PIPE, text=True, timeout=1800).stdout
    tree = Path(out.strip().splitlines()[-1])
    return tree, tree.with_name(tree.name + ".tar")


@pytest.fixture
def moved_away(package):
    """The build folder is elsewhere while the installed copy runs (restored afterwards)."""
    tree, _ = package
    away = tree.with_name(tree.name + ".moved-away")
    os.replace(tree, away)
    try:
        yield away
    finally:
        os.replace(away, tree)


class HashedReader:
    """Reads through to `raw`, hashing what passes: the layer is read once, for both checks."""

    def __init__(self, raw):
        self.raw, self.digest = raw, hashlib.sha256()

    def read(self, size=-1) -> bytes:
        data = self.raw.read(size)
        self.digest.update(data)
        return data

    def sha256(self) -> str:
        while self.read(1 << 20):  # what the extraction left unread (the tar's end padding)
            pass
        return "sha256:" + self.digest.hexdigest()


def _no_owner(member, dest):
    """Modes and symlink texts as they are, owners dropped (LocalAI: WithNoSameOwner)."""
    member = tarfile.tar_filter(member, dest)
    return member.replace(uid=os.getuid(), gid=os.getgid(), uname=None, gname=None)


def unpack_docker_archive(tar_path: Path, dest: Path) -> None:
    """The image's layers applied in order into `dest`, reading entries by their exact names."""
    with tarfile.open(tar_path) as outer:
        entries = {m.name: m for m in outer.getmembers()}
        assert "manifest.json" in entries, sorted(entries)[:5]
        manifest = json.load(outer.extractfile(entries["manifest.json"]))
        assert len(manifest) == 1, "LocalAI reads an archive of exactly one image"
        config = json.load(outer.extractfile(entries[manifest[0]["Config"]]))
        diff_ids = []
        for name in manifest[0]["Layers"]:
            stream = HashedReader(outer.extractfile(entries[name]))
            with tarfile.open(fileobj=stream, mode="r|") as layer:
                layer.extractall(dest, filter=_no_owner)
            diff_ids.append(stream.sha256())
        assert config["rootfs"]["diff_ids"] == diff_ids


def install_like_localai(backends: Path, name: str, unpack) -> Path:
    staging = backends / f"{name}.install-tmp"
    staging.mkdir(parents=True)
    unpack(staging)
    assert (staging / "run.sh").exists(), "not a valid backend: run file not found"
    (staging / "metadata.json").write_text(json.dumps({"name": name, "installed_at": "now"}))
    folder = backends / name
    os.rename(staging, folder)
    return folder


def host_env(root: Path) -> dict:
    """A host's environment with no Python anywhere on PATH and junk Python settings."""
    bin_dir = root / "host-bin"
    bin_dir.mkdir()
    for tool in HOST_TOOLS:
        os.symlink(shutil.which(tool), bin_dir / tool)
    assert not any(shutil.which(p, path=str(bin_dir)) for p in ("python", "python3"))
    return {"PATH": str(bin_dir), "HOME": str(root / "home"), "PYTHONHOME": JUNK, "PYTHONPATH": JUNK,
            "HF_HOME": str(root / "models"), "MLX_BACKEND_CACHE_DIR": str(root / "cache"),
            "MLX_BACKEND_PROMPT_CACHE_DIR": str(root / "prompt-cache")}


def relocation_problems(folder: Path, build_path: str) -> list:
    """Symlinks that are absolute or leave the folder; the build path where a move would break it."""
    found = []
    for path in folder.rglob("*"):
        if path.is_symlink():
            target = os.readlink(path)
            if os.path.isabs(target) or not path.resolve().is_relative_to(folder.resolve()):
                found.append(f"{path}: {target}")
        elif path.is_file() and (path.name == "run.sh" or path.suffix in (".sh", ".cfg", ".pth")):
            found += [str(path)] if build_path in path.read_text(errors="replace") else []
        elif path.is_file() and path.parent.name == "bin":
            with open(path, "rb") as f:
                found += [str(path)] if build_path.encode() in f.readline() else []
    return found


def listing(folder: Path) -> set:
    """Every entry as (path, mode, size or link text): what an unpacker must reproduce."""
    found = set()
    for path in folder.rglob("*"):
        st = path.lstat()
        content = os.readlink(path) if path.is_symlink() else (st.st_size if path.is_file() else None)
        found.add((path.relative_to(folder).as_posix(), st.st_mode, content))
    return found


def mapped_files(pid: int) -> set:
    with open(f"/proc/{pid}/maps") as f:
        return {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}


def serve_installed(folder: Path, root: Path, log_path: Path, answer: bool = True) -> None:
    """Start `folder` as LocalAI does, check it runs on its own Python, load and predict (when
    `answer`), stop."""
    text = (folder / "run.sh").read_text()
    commands = [line for line in text.splitlines()[1:] if not line.lstrip().startswith("#")]
    assert text.startswith("#!") and not any(w in line for line in commands for w in ("pip", "install", "curl", "wget"))
    proc, channel, stub = start_like_localai(folder, log_path, env=host_env(root))
    try:
        wait_healthy_like_the_host(stub, proc)
        if os.path.exists(f"/proc/{proc.pid}"):  # Linux: nothing of the host's Python is mapped
            python_files = {p for p in mapped_files(proc.pid) if "python" in p.lower()}
            inside = str(folder.resolve()) + os.sep
            assert python_files and all(p.startswith(inside) for p in python_files), python_files
            assert os.path.realpath(f"/proc/{proc.pid}/exe").startswith(inside)
            # The host's environment preloads nothing: where the machine has OpenBLAS, the
            # server preloaded it itself (the tests' own servers inherit it from pytest).
            if os.path.exists(openblas.DEFAULT_LIB):
                assert os.path.realpath(openblas.DEFAULT_LIB) in mapped_files(proc.pid)
        if answer:
            result = stub.LoadModel(backend_pb2.ModelOptions(Model="", ContextSize=2048), timeout=300)
            assert result.success, result.message
            reply = stub.Predict(chat("What is the capital of France?", Tokens=8), timeout=120)
            assert reply.tokens > 0 and b"Paris" in reply.message, reply.message
            chunks = list(stub.PredictStream(chat("What is the capital of France?", Tokens=8), timeout=120))
            assert b"".join(c.message for c in chunks) == reply.message
        assert stop_like_localai(proc), "processes of the backend's group outlived LocalAI's SIGKILL deadline"
    finally:
        channel.close()
        kill_group(proc)


def test_tar_installs_and_runs_as_localai_runs_it(package, moved_away, tmp_path, log_dir):
    tree, tar = package
    root = tmp_path / "local ai"
    folder = install_like_localai(root / "backends", tree.name, lambda dest: unpack_docker_archive(tar, dest))
    assert not relocation_problems(folder, str(tree.parent))
    assert {e for e in listing(folder) if e[0] != "metadata.json"} == listing(moved_away)
    serve_installed(folder, root, log_dir / "package-tar.log")


def test_folder_installs_and_runs_as_localai_runs_it(package, moved_away, tmp_path, log_dir):
    tree, _ = package
    root = tmp_path / "local ai"
    # A plain folder is copied with its symlinks as they are.
    folder = install_like_localai(root / "backends", tree.name,
                                  lambda dest: shutil.copytree(moved_away, dest, symlinks=True, dirs_exist_ok=True))
    assert not relocation_problems(folder, str(tree.parent))
    # The same entries as the tar's install, which loads and answers: here it starts on its own
    # Python and answers Health (a load would repeat the tar test's, file for file).
    assert {e for e in listing(folder) if e[0] != "metadata.json"} == listing(moved_away)
    serve_installed(folder, root, log_dir / "package-folder.log", answer=False)
