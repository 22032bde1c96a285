"""Draft models for speculative decoding tests and benches, built from the embedded model."""

import json
import os
import shutil

from models import building


def short_copy(layers: int) -> str:
    """The embedded model with only its first `layers` layers: a cheap (poor) draft."""
    import mlx.core as mx

    from loaders.gguf_loader import gguf_to_mlx_dir
    from models import models_root
    from loaders.model_loader import embedded_default

    src = gguf_to_mlx_dir(embedded_default())
    target = models_root() / f"smollm2-{layers}-layers"
    with building(target) as tmp:
        # Every file there (a link left by an earlier version into a store root since removed is not).
        if not all((target / n).exists() for n in ("model.safetensors", "config.json", "tokenizer.json")):
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            cfg = json.loads((src / "config.json").read_text())
            cfg["num_hidden_layers"] = layers
            (tmp / "config.json").write_text(json.dumps(cfg))
            for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
                if (src / name).exists():
                    # Copied: the conversion lives in this run's store root, which goes with the run.
                    shutil.copyfile(src / name, tmp / name)
            weights = mx.load(str(src / "model.safetensors"))
            mx.save_safetensors(str(tmp / "model.safetensors"), {
                k: v for k, v in weights.items()
                if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers})
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
    return str(target)
