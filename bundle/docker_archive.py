"""Write a folder as a one-layer image in the docker-archive format (what `docker save` writes).

LocalAI's `ocifile://` installer reads exactly this: `manifest.json` at the top listing one
image, its config and its layers by entry name (compared as written, so no `./` prefix); the
layers are applied in order. The layer is an uncompressed tar of the folder with modes and
symlinks as they are and owners dropped (root), so the unpacked tree is the folder itself.
"""

import hashlib
import io
import json
import os
import platform
import tarfile
from pathlib import Path

ARCHITECTURES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
CHUNK = 1 << 20


def _as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def write_layer(folder: Path, out: Path) -> str:
    """The folder as an uncompressed tar, entries relative to it in sorted order; its sha256."""
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for parent, dirs, files in os.walk(folder):
            dirs.sort()
            for name in dirs + sorted(files):
                path = Path(parent) / name
                tar.add(path, arcname=path.relative_to(folder).as_posix(), recursive=False, filter=_as_root)
    digest = hashlib.sha256()
    with open(out, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = _as_root(tarfile.TarInfo(name))
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))


def write(folder: Path, out: Path, repo_tag: str = "", os_name: str = "") -> int:
    """`out`: the docker-archive tar of `folder`; its size in bytes."""
    layer_path = out.with_name(out.name + ".layer")
    try:
        diff_id = write_layer(folder, layer_path)
        config = json.dumps({
            "architecture": ARCHITECTURES.get(platform.machine().lower(), platform.machine().lower()),
            "os": os_name or platform.system().lower(),
            "config": {"Entrypoint": ["/run.sh"]},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        }, indent=2).encode()
        config_name = hashlib.sha256(config).hexdigest() + ".json"
        layer_name = f"{diff_id}/layer.tar"
        manifest = [{"Config": config_name, "RepoTags": [repo_tag] if repo_tag else None, "Layers": [layer_name]}]
        partial = out.with_name(out.name + ".partial")
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
            _add_bytes(tar, "manifest.json", json.dumps(manifest).encode())
            _add_bytes(tar, config_name, config)
            tar.add(layer_path, arcname=layer_name, filter=_as_root)
        os.replace(partial, out)  # whole or not at all: a LocalAI reading it never sees half
    finally:
        layer_path.unlink(missing_ok=True)
    return out.stat().st_size
