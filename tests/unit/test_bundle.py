"""`make package`'s parts that need no build: the gallery against LocalAI's platform filter,
the relocation of scripts and of the interpreter's library path, the docker-archive layout,
the interpreter layer kept between builds."""

import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import pytest

from common.launcher import REPO

sys.path.insert(0, os.path.join(REPO, "bundle"))

import docker_archive  # noqa: E402
import elf  # noqa: E402
import gallery  # noqa: E402
import layer_cache  # noqa: E402
import precompile  # noqa: E402
import relocate  # noqa: E402
import store  # noqa: E402


# ---- LocalAI's side, from its pkg/system/capabilities.go (the oracle) -------------

def localai_offers(name: str, uri: str, capability: str) -> bool:
    """IsBackendCompatible: name + uri, lower-cased, matched as substrings."""
    text = f"{name} {uri}".lower()
    if any(t in text for t in ("darwin", "mlx", "metal")):
        return capability in ("metal", "darwin-x86")
    if "l4t" in text:
        return capability.startswith("nvidia-l4t")
    if "cuda" in text or "nvidia" in text:
        return capability.startswith("nvidia")
    if any(t in text for t in ("rocm", "hip", "amd")):
        return capability == "amd"
    if "sycl" in text or "intel" in text:
        return capability == "intel"
    return True


def localai_pick(capabilities: dict, capability: str) -> str:
    """Capability(): the reported one if the meta entry maps it, else default, else cpu."""
    for key in (capability, "default", "cpu"):
        if key in capabilities:
            return capabilities[key]
    return ""


@pytest.mark.parametrize("built", [[], ["cuda12"]])
def test_each_host_gets_the_build_made_for_it(built):
    meta, *entries = gallery.index("quay.io/someone/mx-backend", "v1", built)
    by_name = {e["name"]: e for e in entries}
    assert "uri" not in meta and "mlx" not in by_name
    expected = {"metal": "metal-mlx-backend", "default": "cpu-mx-backend", "amd": "cpu-mx-backend",
                "intel": "cpu-mx-backend"}
    if built:
        expected.update({c: "cuda12-mx-backend" for c in ("nvidia", "nvidia-cuda-12", "nvidia-cuda-13")})
    else:
        expected["nvidia-cuda-12"] = "cpu-mx-backend"
    for capability, name in expected.items():
        assert localai_pick(meta["capabilities"], capability) == name, capability
        assert localai_offers(name, by_name[name]["uri"], capability), (capability, by_name[name]["uri"])
    # And no build is offered where it cannot run.
    assert not localai_offers("metal-mlx-backend", by_name["metal-mlx-backend"]["uri"], "default")
    if built:
        assert not localai_offers("cuda12-mx-backend", by_name["cuda12-mx-backend"]["uri"], "default")


@pytest.mark.parametrize("image", ["quay.io/me/mlx-backend", "ghcr.io/me/backend-amd64", "docker.io/intel/x"])
def test_an_image_prefix_that_would_hide_the_linux_build_is_refused(image):
    with pytest.raises(SystemExit, match="LocalAI would offer"):
        gallery.index(image, "latest", [])


def localai_pulls_an_image(uri: str) -> bool:
    """LooksLikeOCI (pkg/downloader/uri.go): what LocalAI installs as an image; else a plain download."""
    return uri.startswith(("quay.io", "oci://", "ollama://", "ocifile://", "ghcr.io", "docker.io"))


def test_the_default_gallery_installs_the_tar_built_here(tmp_path):
    tar = tmp_path / "dist" / "cpu-mx-backend.tar"
    meta, *entries = gallery.index("", "latest", ["cpu"], tar)
    assert [e["uri"] for e in entries] == [f"ocifile://{tar}"]
    assert all(localai_pulls_an_image(e["uri"]) for e in entries)
    assert localai_pick(meta["capabilities"], "default") == entries[0]["name"] == "cpu-mx-backend"
    assert gallery.archive_tag("", "latest", gallery.FLAVOURS["cpu"]) == "mx-backend:latest-cpu"


@pytest.mark.parametrize("image", ["localhost:5000/mx-backend", "registry.example.com/me/x", "me/x"])
def test_an_image_localai_would_download_as_a_file_is_refused_with_the_reason(image):
    assert not localai_pulls_an_image(f"{image}:latest-cpu")
    with pytest.raises(SystemExit, match="no prefix LocalAI pulls as an image.*oci://"):
        gallery.index(image, "latest", [])


@pytest.mark.parametrize("image", ["oci://localhost:5000/mx-backend", "quay.io/me/x", "ghcr.io/me/x", "docker.io/me/x"])
def test_every_registry_entry_is_one_localai_pulls(image):
    _, *entries = gallery.index(image, "v1", ["cuda12"])
    assert entries and all(localai_pulls_an_image(e["uri"]) for e in entries)
    tag = gallery.archive_tag(image, "v1", gallery.FLAVOURS["cpu"])
    assert tag == image.removeprefix("oci://") + ":v1-cpu"


# ---- relocation ----------------------------------------------------------------


def test_a_console_script_runs_after_its_folder_moves(tmp_path):
    built = tmp_path / "build here"
    (built / "bin").mkdir(parents=True)
    os.symlink(sys.executable, built / "bin" / "python3")
    script = built / "bin" / "hello"
    script.write_text(f"#!{built}/bin/python3\nimport sys\nprint('hello', *sys.argv[1:])\n")
    script.chmod(0o755)
    assert sorted(relocate.problems(built, [str(built)])) == [
        f"bin/hello: names {built}", f"bin/python3: symlink to {sys.executable} leaves the tree"]
    assert relocate.rewrite_shebangs(built / "bin", str(built)) == 1
    moved = tmp_path / "moved elsewhere"
    os.rename(built, moved)
    out = subprocess.run([str(moved / "bin" / "hello"), "a b"], capture_output=True, text=True, check=True).stdout
    assert out == "hello a b\n"
    assert relocate.problems(moved, [str(built)]) == [f"bin/python3: symlink to {sys.executable} leaves the tree"]


def test_problems_name_what_a_move_breaks(tmp_path):
    (tmp_path / "lib" / "site").mkdir(parents=True)
    (tmp_path / "lib" / "site" / "x.pth").write_text(f"{tmp_path}/lib\n")
    (tmp_path / "lib" / "ok.txt").write_text(f"{tmp_path} in a file nobody moves by\n")
    os.symlink("../ok.txt", tmp_path / "lib" / "site" / "inside")
    os.symlink("../../..", tmp_path / "lib" / "site" / "outside")
    assert sorted(relocate.problems(tmp_path, [str(tmp_path)])) == [
        "lib/site/outside: symlink to ../../.. leaves the tree", f"lib/site/x.pth: names {tmp_path}"]


@pytest.mark.skipif(not sys.platform.startswith("linux") or not sysconfig.get_config_var("Py_ENABLE_SHARED"),
                    reason="a Linux interpreter linked to libpython")
def test_the_copied_interpreter_loads_the_libpython_beside_it(tmp_path):
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    soname = sysconfig.get_config_var("INSTSONAME")
    root = tmp_path / "py"
    (root / "bin").mkdir(parents=True)
    (root / "lib").mkdir()
    shutil.copy2(Path(sys.base_prefix) / "bin" / version, root / "bin" / version)
    shutil.copy2(Path(sysconfig.get_config_var("LIBDIR")) / soname, root / "lib" / soname)
    if not elf.search_paths(root / "bin" / version):
        pytest.skip("this interpreter has no library search path to rewrite")
    assert elf.replace_search_path(root / "bin" / version, sys.base_prefix, "$ORIGIN/../lib")
    maps = subprocess.run([str(root / "bin" / version), "-c", "print(open('/proc/self/maps').read())"],
                          capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"}).stdout
    assert str(root / "lib" / soname) in maps


# ---- the docker-archive layout ---------------------------------------------------


def test_the_archive_is_one_image_whose_layer_is_the_folder(tmp_path):
    tree = tmp_path / "tree"
    (tree / "a dir").mkdir(parents=True)
    (tree / "run.sh").write_text("#!/bin/sh\n")
    (tree / "run.sh").chmod(0o755)
    (tree / "a dir" / "data").write_bytes(b"x" * 10)
    os.symlink("../run.sh", tree / "a dir" / "link")
    out = tmp_path / "image.tar"
    assert docker_archive.write(tree, out, repo_tag="localhost:5000/x:latest-cpu") == out.stat().st_size
    with tarfile.open(out) as outer:
        names = outer.getnames()
        manifest = json.load(outer.extractfile("manifest.json"))
        assert len(manifest) == 1 and not any(n.startswith(("./", "/")) for n in names)
        config = json.load(outer.extractfile(manifest[0]["Config"]))
        layer_bytes = outer.extractfile(manifest[0]["Layers"][0]).read()
    assert manifest[0]["RepoTags"] == ["localhost:5000/x:latest-cpu"]
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer_bytes).hexdigest()]
    with tarfile.open(fileobj=io.BytesIO(layer_bytes)) as layer:
        members = {m.name: m for m in layer.getmembers()}
    assert sorted(members) == ["a dir", "a dir/data", "a dir/link", "run.sh"]
    assert members["run.sh"].mode & 0o777 == 0o755 and members["a dir/link"].linkname == "../run.sh"
    assert all(m.uid == 0 and m.gid == 0 and not m.uname for m in members.values())


# ---- byte-code for what the server imports ------------------------------------------


def test_every_absolute_import_is_warmed_with_the_names_it_takes(tmp_path):
    (tmp_path / "a.py").write_text("import os, json as j\nfrom transformers import AutoTokenizer\n"
                                   "def f():\n    from mlx_vlm.utils import load, prepare_inputs\n"
                                   "    from . import sibling\n    from transformers import *\n")
    (tmp_path / "b.py").write_text("import mlx_vlm.utils\nfrom transformers import PreTrainedTokenizerFast\n")
    assert precompile.imports_of([tmp_path / "a.py", tmp_path / "b.py"]) == [
        ("json", []), ("mlx_vlm.utils", ["load", "prepare_inputs"]), ("os", []),
        ("transformers", ["AutoTokenizer", "PreTrainedTokenizerFast"])]


# ---- the interpreter layer kept between builds -----------------------------------------


class Maker:
    """A stand-in for laying out the interpreter: a small tree, and how often it was made."""

    def __init__(self, text=b"print(1)\n"):
        self.calls, self.text = 0, text

    def __call__(self, dest: Path) -> None:
        self.calls += 1
        (dest / "bin").mkdir(parents=True)
        (dest / "bin" / "python3.11").write_bytes(self.text)
        (dest / "bin" / "python3.11").chmod(0o755)
        os.symlink("python3.11", dest / "bin" / "python3")
        (dest / "lib").mkdir(mode=0o750)
        (dest / "lib" / "empty").write_bytes(b"")


def listing_of(root: Path) -> list:
    """Written differently from the module's manifest: (path, mode, bytes or link text)."""
    return sorted((p.relative_to(root).as_posix(), p.lstat().st_mode,
                   os.readlink(p) if p.is_symlink() else (p.read_bytes() if p.is_file() else None))
                  for p in root.rglob("*"))


def test_a_layer_is_made_once_per_key_and_copied_whole(tmp_path):
    cache, make = tmp_path / "new" / "cache", Maker()
    assert not layer_cache.provide(str(cache), "k1", tmp_path / "one", make)
    assert layer_cache.provide(str(cache), "k1", tmp_path / "two", make)
    assert make.calls == 1 and listing_of(tmp_path / "two") == listing_of(tmp_path / "one")
    assert (cache.stat().st_mode & 0o777) == (cache.parent.stat().st_mode & 0o777) == 0o700
    # Another key (new packages) is made anew, and the older layer goes.
    other = Maker(b"print(2)\n")
    assert not layer_cache.provide(str(cache), "k2", tmp_path / "three", other)
    assert other.calls == 1 and (tmp_path / "three" / "bin" / "python3.11").read_bytes() == b"print(2)\n"
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".lock")) == ["python-k2"]


@pytest.mark.parametrize("damage", ["changed", "added", "removed", "relinked", "no manifest"])
def test_a_damaged_layer_is_never_taken(tmp_path, damage):
    cache, make = tmp_path / "cache", Maker()
    layer_cache.provide(str(cache), "k", tmp_path / "one", make)
    stored = cache / "python-k"
    if damage == "changed":  # same size, other bytes
        (stored / "bin" / "python3.11").write_bytes(b"print(7)\n")
    elif damage == "added":
        (stored / "lib" / "extra.pth").write_text("import evil\n")
    elif damage == "removed":
        (stored / "lib" / "empty").unlink()
    elif damage == "relinked":
        (stored / "bin" / "python3").unlink()
        os.symlink("/usr/bin/python3", stored / "bin" / "python3")
    else:
        (stored / store.MANIFEST).unlink()
    assert not layer_cache.provide(str(cache), "k", tmp_path / "two", make)
    assert make.calls == 2 and listing_of(tmp_path / "two") == listing_of(tmp_path / "one")
    assert layer_cache.provide(str(cache), "k", tmp_path / "three", make)  # stored anew, whole
    assert listing_of(tmp_path / "three") == listing_of(tmp_path / "one")


def test_a_dead_builds_leftover_is_swept_and_a_loose_folder_is_tightened_and_verified(tmp_path):
    cache, make = tmp_path / "cache", Maker()
    cache.mkdir(mode=0o700)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = os.uname().nodename.replace("-", "_") or "host"
    leftover = cache / f"{store.TMP}{host}-{dead.pid}-00000000-python-k"  # a build that died while storing
    (leftover / "bin").mkdir(parents=True)
    assert not layer_cache.provide(str(cache), "k", tmp_path / "one", make)
    assert not leftover.exists()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # this user's, made loose: tightened, and what it holds is verified when taken
    assert not layer_cache.provide(str(shared), "k", tmp_path / "two", make)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o700
    assert layer_cache.provide(str(shared), "k", tmp_path / "three", make)
    assert make.calls == 2 and listing_of(tmp_path / "three") == listing_of(tmp_path / "one")
    assert not layer_cache.provide("", "k", tmp_path / "four", make) and make.calls == 3


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a folder to another user")
def test_a_folder_of_another_user_is_not_used_and_the_build_goes_on(tmp_path):
    cache, make = tmp_path / "theirs", Maker()
    cache.mkdir(mode=0o755)
    os.chown(cache, 65534, 65534)
    assert not layer_cache.provide(str(cache), "k", tmp_path / "one", make)
    assert not layer_cache.provide(str(cache), "k", tmp_path / "two", make)
    assert make.calls == 2 and os.listdir(cache) == []


def test_a_copy_that_fails_fails_the_build_and_keeps_the_stored_layer(tmp_path, monkeypatch):
    cache, make = tmp_path / "cache", Maker()
    layer_cache.provide(str(cache), "k", tmp_path / "one", make)

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store.shutil, "copytree", full_disk)
    with pytest.raises(OSError, match="No space"):
        layer_cache.provide(str(cache), "k", tmp_path / "two", make)
    monkeypatch.undo()
    assert layer_cache.provide(str(cache), "k", tmp_path / "three", make) and make.calls == 1
