"""One float32 model directory that every server of the peer bench loads, ours included.

Our server, loaded with defaults on this CPU, converts the embedded SmolLM2 GGUF into an
mlx-lm directory (4-bit) and casts it to float32 in memory (loaders.model_loader, when
OpenBLAS is preloaded). The peers load directories only, so the same steps write that
float32 model to disk once: the converted directory's config without its quantization,
the weights dequantized and cast by our loader's own `_cast`, its tokenizer files as they are.
"""

import json
import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger("bench-peers")

COMPLETE = "COMPLETE"
COPIED = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def float32_dir(root: str) -> Path:
    """The float32 directory under `root`, written on first use."""
    from loaders.gguf_loader import gguf_to_mlx_dir
    from loaders.model_loader import embedded_default

    source = gguf_to_mlx_dir(embedded_default())
    target = Path(root) / "models" / f"{source.name}-float32"
    if (target / COMPLETE).exists():
        return target
    log.info("writing the float32 model for every server into %s (first run only)", target)
    tmp = target.with_name(target.name + f".partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _write(source, tmp)
    (tmp / COMPLETE).write_text(str(source) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target


def _write(source: Path, dest: Path) -> None:
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.utils import save_config, save_model

    from loaders.model_loader import _cast

    model, _ = load(str(source))
    _cast(model, "float32")
    save_model(dest, model)
    config = json.loads((source / "config.json").read_text())
    config.pop("quantization", None)
    save_config(config, dest / "config.json")
    for name in COPIED:
        if (source / name).exists():
            shutil.copy(source / name, dest / name)
    del model
    mx.clear_cache()
