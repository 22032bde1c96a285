"""Write a folder as a one-layer image in the docker-archive format (what `docker save` writes).

LocalAI's `ocifile://` installer reads exactly this: `manifest.json` listing one image, its
config and its layers by entry name (compared as written, so no `./` prefix); the layers are
applied in order. The layer is an uncompressed tar of the folder with modes and symlinks as
they are and owners dropped (root), so the unpacked tree is the folder itself.

The artifact is about a gigabyte: the layer is streamed into the archive once, hashed on the
way, and its entry header written when its size is known.
"""

import hashlib
import io
import json
import os
import platform
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "backend"))

import store  # noqa: E402  (puts the archive in place whole)

ARCHITECTURES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
BLOCK = tarfile.BLOCKSIZE


def _as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


class _Hashing(io.RawIOBase):
    """A write-only stream that hashes and counts what passes through to `out`."""

    def __init__(self, out):
        self.out, self.digest, self.size = out, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.digest.update(data)
        self.size += len(data)
        return self.out.write(data)

    def tell(self) -> int:
        return self.size


def write_layer(folder: Path, out) -> tuple:
    """The folder as a tar written to `out`, entries relative to it in sorted order: (sha256, size)."""
    stream = _Hashing(out)
    with tarfile.open(fileobj=stream, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for parent, dirs, files in os.walk(folder):
            dirs.sort()
            for name in dirs + sorted(files):
                path = Path(parent) / name
                tar.add(path, arcname=path.relative_to(folder).as_posix(), recursive=False, filter=_as_root)
    return stream.digest.hexdigest(), stream.size


def _header(name: str, size: int) -> bytes:
    info = _as_root(tarfile.TarInfo(name))
    info.size, info.mode = size, 0o644
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def _entry(out, name: str, data: bytes) -> None:
    out.write(_header(name, len(data)) + data + b"\0" * (-len(data) % BLOCK))


def write(folder: Path, out: Path, repo_tag: str = "", os_name: str = "") -> int:
    """`out`: the docker-archive tar of `folder`; its size in bytes."""
    partial = out.with_name(out.name + ".partial")
    with open(partial, "wb") as f:
        f.write(b"\0" * BLOCK)  # the layer's header, written once its size is known
        diff_id, size = write_layer(folder, f)  # tarfile ends it on a whole record: no padding
        layer_name = f"{diff_id}/layer.tar"
        config = json.dumps({
            "architecture": ARCHITECTURES.get(platform.machine().lower(), platform.machine().lower()),
            "os": os_name or platform.system().lower(),
            "config": {"Entrypoint": ["/run.sh"]},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        }, indent=2).encode()
        config_name = hashlib.sha256(config).hexdigest() + ".json"
        manifest = [{"Config": config_name, "RepoTags": [repo_tag] if repo_tag else [], "Layers": [layer_name]}]
        _entry(f, config_name, config)
        _entry(f, "manifest.json", json.dumps(manifest).encode())
        f.write(b"\0" * (2 * BLOCK))  # end of archive
        f.seek(0)
        f.write(_header(layer_name, size))
    store.publish(partial, out)  # whole or not at all: a LocalAI reading it never sees half
    return out.stat().st_size
