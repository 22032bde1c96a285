"""dist/index.yaml: a LocalAI backend gallery with one meta entry and one entry per build.

LocalAI offers a concrete entry only where its name and uri fit the host (facts from its
pkg/system/capabilities.go): any of `mlx`, `metal`, `darwin` marks an entry macOS-only;
`cuda` or `nvidia` NVIDIA-only; `amd` (so `amd64` too), `rocm`, `hip` AMD-only; `intel`,
`sycl` Intel-only; `l4t` Jetson-only. So the Linux entries are named `mx`, not `mlx`, and
the image prefix may carry none of these words. The meta entry is matched by its
capabilities only; `mlx` itself is LocalAI's own backend and is left alone.
"""

from dataclasses import dataclass

import yaml

META = "mlx-backend"
DESCRIPTION = ("MLX models (mlx-lm text, GGUF, mlx-vlm vision, embeddings) served over gRPC with "
               "continuous batching, on Apple GPUs (Metal), NVIDIA (CUDA) or the CPU.")
PLATFORM_WORDS = ("mlx", "metal", "darwin", "cuda", "nvidia", "l4t", "amd", "rocm", "hip", "intel", "sycl")


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


def check_image(image: str) -> None:
    words = [w for w in PLATFORM_WORDS if w in image.lower()]
    if words:
        raise SystemExit(f"the image {image!r} (PACKAGE_IMAGE) contains {', '.join(map(repr, words))}: LocalAI "
                         "would offer every entry of the index only on that platform; choose a name without it")


def index(image: str, version: str, flavours) -> list:
    """The gallery entries: the meta entry first, then one per flavour."""
    check_image(image)
    chosen = [FLAVOURS[f] for f in dict.fromkeys([*ALWAYS, *flavours])]
    meta = {
        "name": META, "description": DESCRIPTION, "license": "MIT",
        "urls": ["https://github.com/ml-explore/mlx"], "tags": ["text-to-text", "LLM", "multimodal", "embeddings"],
        "capabilities": {cap: f.name for f in chosen for cap in f.capabilities},
    }
    concrete = [{"name": f.name, "uri": image_uri(image, version, f), "version": version,
                 "description": DESCRIPTION, "alias": META} for f in chosen]
    return [meta, *concrete]


def write(path, image: str, version: str, flavours) -> None:
    with open(path, "w") as f:
        f.write("# LocalAI backend gallery (LOCALAI_BACKEND_GALLERIES); written by `make package`.\n")
        yaml.safe_dump(index(image, version, flavours), f, sort_keys=False, width=100)
