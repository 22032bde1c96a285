"""dist/index.yaml: a LocalAI backend gallery with one meta entry and one entry per build.

LocalAI offers a concrete entry only where its name and uri fit the host (facts from its
pkg/system/capabilities.go): any of `mlx`, `metal`, `darwin` marks an entry macOS-only;
`cuda` or `nvidia` NVIDIA-only; `amd` (so `amd64` too), `rocm`, `hip` AMD-only; `intel`,
`sycl` Intel-only; `l4t` Jetson-only. So the Linux entries are named `mx`, not `mlx`, and
the image prefix may carry none of these words. The meta entry is matched by its
capabilities only; `mlx` itself is LocalAI's own backend and is left alone.

LocalAI pulls an image only for a uri it takes for one (pkg/downloader/uri.go, LooksLikeOCI:
one starting with `quay.io`, `ghcr.io`, `docker.io`, `oci://`, `ocifile://` or `ollama://`);
any other is downloaded as a plain file and fails. So an image prefix must start with one of
the first four; with none given, the index is a gallery for this machine: its one entry is the
tar just built, as `ocifile://<its absolute path>`.
"""

from dataclasses import dataclass

import yaml

META = "mlx-backend"
DESCRIPTION = ("MLX models (mlx-lm text, GGUF, mlx-vlm vision, embeddings) served over gRPC with "
               "continuous batching, on Apple GPUs (Metal), NVIDIA (CUDA) or the CPU.")
PLATFORM_WORDS = ("mlx", "metal", "darwin", "cuda", "nvidia", "l4t", "amd", "rocm", "hip", "intel", "sycl")
REGISTRY_PREFIXES = ("quay.io/", "ghcr.io/", "docker.io/", "oci://")  # what LocalAI pulls as an image
LOCAL_IMAGE = "mx-backend"  # the archive's own tag when no registry is named


@dataclass(frozen=True)
class Flavour:
    name: str            # the concrete gallery entry, and the package's folder name
    tag: str             # the image tag after the version
    capabilities: tuple  # LocalAI capabilities this build serves


FLAVOURS = {
    "metal": Flavour("metal-mlx-backend", "metal-darwin-arm64", ("metal",)),
    "cpu": Flavour("cpu-mx-backend", "cpu", ("default",)),
    # mlx[cuda] ships its CUDA 12 runtime as wheels: a CUDA 13 driver runs it as well.
    "cuda12": Flavour("cuda12-mx-backend", "gpu-nvidia-cuda-12", ("nvidia", "nvidia-cuda-12", "nvidia-cuda-13")),
}
ALWAYS = ("metal", "cpu")  # the release set; CUDA joins when it is built


def image_uri(image: str, version: str, flavour: Flavour) -> str:
    return f"{image}:{version}-{flavour.tag}"


def archive_tag(image: str, version: str, flavour: Flavour) -> str:
    """The tag written into the docker archive: the registry's name without `oci://`."""
    return image_uri(image[len("oci://"):] if image.startswith("oci://") else image or LOCAL_IMAGE, version, flavour)


def check_image(image: str) -> None:
    """SystemExit, with the reason, for an image prefix LocalAI would not install from ("" is this machine's)."""
    if not image:
        return
    if not image.startswith(REGISTRY_PREFIXES):
        raise SystemExit(f"the image {image!r} (PACKAGE_IMAGE) has no prefix LocalAI pulls as an image "
                         f"({', '.join(REGISTRY_PREFIXES)}: pkg/downloader/uri.go LooksLikeOCI); it would download "
                         "the uri as a plain file and fail. Name your registry as oci://<host>/<name>, or leave "
                         "PACKAGE_IMAGE empty for a gallery of this machine (ocifile:// of the tar)")
    words = [w for w in PLATFORM_WORDS if w in image.lower()]
    if words:
        raise SystemExit(f"the image {image!r} (PACKAGE_IMAGE) contains {', '.join(map(repr, words))}: LocalAI "
                         "would offer every entry of the index only on that platform; choose a name without it")


def index(image: str, version: str, flavours, tar=None) -> list:
    """The gallery entries: the meta entry first, then one per flavour. With no `image`, the one
    entry of this build (`flavours`' first), installed from `tar` (`ocifile://`)."""
    check_image(image)
    if not image:
        flavour = FLAVOURS[flavours[0]]
        meta = {"name": META, "description": DESCRIPTION, "license": "MIT",
                "urls": ["https://github.com/ml-explore/mlx"],
                "tags": ["text-to-text", "LLM", "multimodal", "embeddings"],
                "capabilities": {cap: flavour.name for cap in flavour.capabilities}}
        return [meta, {"name": flavour.name, "uri": f"ocifile://{tar}", "version": version,
                       "description": DESCRIPTION, "alias": META}]
    chosen = [FLAVOURS[f] for f in dict.fromkeys([*ALWAYS, *flavours])]
    meta = {
        "name": META, "description": DESCRIPTION, "license": "MIT",
        "urls": ["https://github.com/ml-explore/mlx"], "tags": ["text-to-text", "LLM", "multimodal", "embeddings"],
        "capabilities": {cap: f.name for f in chosen for cap in f.capabilities},
    }
    concrete = [{"name": f.name, "uri": image_uri(image, version, f), "version": version,
                 "description": DESCRIPTION, "alias": META} for f in chosen]
    return [meta, *concrete]


def write(path, image: str, version: str, flavours, tar=None) -> None:
    with open(path, "w") as f:
        f.write("# LocalAI backend gallery (LOCALAI_BACKEND_GALLERIES); written by `make package`.\n")
        yaml.safe_dump(index(image, version, flavours, tar), f, sort_keys=False, width=100)
