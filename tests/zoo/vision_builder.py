"""Tiny random-weight models of mlx-vlm's vision-language families, built with mlx-vlm's own
classes.

Each is a seeded, float32 directory of well under a megabyte (a 2-layer text model of width
32, a 1-block vision tower, a byte-level BPE trained here; a few MB where the family's
processor writes token ids past that vocabulary: zoo/fixed_ids.py; some hundreds of MB where the
family's code fixes its tower's size and the recipe keeps it: FastVLM) with the files its family's
processor reads: the same architecture and preprocessing code a real checkpoint runs
through. Built once per machine into the test-model cache (the directory's name carries a
hash of its recipe and of mlx-vlm's version), under the shared build lock, into a temporary
folder renamed into place.

The weights are conditioned so that greedy decoding is a stable function of the image and
the prompt: matrices the library initialises to a constant get random values, every matrix
is scaled up (at the default init the image barely reaches the text), and, as
tests/family_models.py does it, the output head is scaled so logits have a standard
deviation near 3 and the rows of special tokens (end of sequence included) are shrunk so
greedy never stops early.

`python tests/zoo/vision_builder.py [family...]` builds them and prints where.
"""

import hashlib
import inspect
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Dict

if __name__ == "__main__":  # as a script: the folders conftest.py puts on the path
    _TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [os.path.join(os.path.dirname(_TESTS), "backend"), _TESTS]

from models import building  # noqa: E402
from vision_fixture import train_tokenizer  # noqa: E402

from zoo import fixed_ids  # noqa: E402
from zoo.vision_recipes import RECIPES, Recipe, module_of  # noqa: E402

BUILD_VERSION = 3  # bump when the weights recipe below changes
LOGIT_STD = 3.0  # greedy's margins are then mostly tenths, far above batching noise
DAMP = 0.01  # what the rows of special tokens keep in the output head
PROBE = "The quick brown fox jumps over the lazy dog."


def default_root() -> Path:
    from models import models_root

    return models_root() / "vision-zoo"


def _tokens(recipe: Recipe, target: Path):
    """The trained tokenizer saved into `target` (with the recipe's tokenizer_config entries)."""
    if recipe.tokenizer is not None:
        return recipe.tokenizer(target, recipe)
    tok = train_tokenizer(target, recipe.specials, recipe.template, eos=recipe.eos, pad=recipe.specials[0],
                     **recipe.named)
    if recipe.fixed:  # special tokens at the ids the family's processor writes in code
        from transformers import AutoTokenizer

        fixed_ids.place(target, recipe.fixed)
        tok = AutoTokenizer.from_pretrained(str(target))
    if recipe.tokenizer_config:
        path = target / "tokenizer_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **recipe.tokenizer_config}, indent=1))
    return tok


def _config(family: str, recipe: Recipe, tok) -> dict:
    ids = {t: tok.convert_tokens_to_ids(t) for t in recipe.specials}
    return recipe.config(module_of(family), ids, len(tok))


def _model(config: dict):
    """mlx-vlm's own model for `config`, configured as its loader configures it."""
    from mlx_vlm.utils import get_model_and_args, update_module_configs

    module, _ = get_model_and_args(dict(config))
    cfg = dict(config)
    cfg.setdefault("text_config", {})
    cfg.setdefault("vision_config", {})
    model_config = module.ModelConfig.from_dict(cfg)
    model_config = update_module_configs(model_config, module, cfg, ["text", "vision", "perceiver", "projector",
                                                                     "audio"])
    return module.Model(model_config)


def _logits_std(model, tok) -> float:
    import mlx.core as mx

    ids = mx.array([tok.encode(PROBE)])
    try:
        out = model.language_model(ids)
    except AttributeError:
        # MiniCPM-o's text model (Qwen3-VL's) reads positions its embedding step sets, as mlx-vlm's
        # generation runs it; on its own it asks its config for a Qwen-VL tower's merge size.
        model.get_input_embeddings(ids, None)
        out = model.language_model(ids)
    except ValueError:
        # A decoder whose encoder is the vision tower (Nemotron-Parse) takes no text alone: it reads
        # the probe over encoder states, random ones of its width.
        if "encoder_outputs" not in inspect.signature(model.language_model.__call__).parameters:
            raise
        states = mx.random.normal((1, 8, model.language_model.lm_head.weight.shape[1]))
        out = model.language_model(decoder_input_ids=ids, encoder_outputs=states)
    logits = getattr(out, "logits", out)
    return float(mx.std(logits[0, -4:].astype(mx.float32)).item())


def _head(weights: Dict[str, object], vocab: int):
    """Name of the output head's matrix and whether it is the (tied) input embedding."""
    heads = [k for k, w in weights.items() if "lm_head" in k and w.ndim == 2 and w.shape[0] == vocab]
    if heads:
        return heads[0], False
    embeds = [k for k, w in weights.items() if "embed_tokens" in k and w.ndim == 2 and w.shape[0] == vocab]
    return (embeds[0] if embeds else None), True


def _final_norm(weights: Dict[str, object]):
    norms = [k for k in weights if k.startswith("language_model.") and k.endswith("norm.weight")
             and ".layers." not in k]
    return min(norms, key=len) if norms else None


def _varied(w):
    """`w`, or what a checkpoint would put there instead of the library's constant start:
    random values of the usual scale for a matrix (Gemma 3's image projection, position
    tables, MoE router gates: left constant, the image would not reach the text, or routing
    would tie), 1 for a scalar gate at 0 (Llama 3.2 Vision's cross-attention gates: closed,
    the text never sees the image)."""
    import mlx.core as mx

    if w.size == 1 and float(w.item()) == 0.0:
        return mx.ones_like(w)
    if w.ndim >= 2 and w.size > 1 and float(mx.std(w.astype(mx.float32)).item()) == 0.0:
        return (mx.random.normal(w.shape) * w.shape[-1] ** -0.5).astype(w.dtype)
    return w


def _scale(recipe: Recipe, name: str) -> float:
    if any(u in name for u in recipe.unscaled):
        return 1.0
    return next((f for part, f in recipe.scaled.items() if part in name), recipe.scale)


def conditioned(family: str, recipe: Recipe, config: dict, tok) -> Dict[str, object]:
    """The family's seeded weights, scaled so the text depends on the image, the head so greedy
    margins are wide, the special tokens' rows shrunk."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    mx.random.seed(int(hashlib.sha256(family.encode()).hexdigest()[:8], 16))
    model = _model(config)
    weights = {k: _varied(v) for k, v in tree_flatten(model.parameters())}
    weights = {k: v * _scale(recipe, k) if v.ndim >= 2 else v for k, v in weights.items()}
    if recipe.packed is not None:
        weights = recipe.packed(weights, config)
    model.load_weights(list(weights.items()))
    vocab = len(tok)
    head, tied = _head(weights, vocab)
    std = _logits_std(model, tok)
    target = _final_norm(weights) if tied else head
    if target is not None and std > 0:
        weights[target] = weights[target] * (LOGIT_STD / std)
    if head is not None:  # and the fillers of a vocabulary padded to fixed ids: no text holds them either
        quiet = sorted(set(tok.all_special_ids) | fixed_ids.fillers(tok))
        special = mx.zeros((vocab, 1), dtype=mx.bool_)
        special[mx.array(quiet)] = True
        weights[head] = mx.where(special, weights[head] * DAMP, weights[head])
    return weights


def _recipe_name(family: str, config: dict, recipe: Recipe) -> str:
    import mlx_vlm

    recipe_text = json.dumps([config, recipe.files, recipe.tokenizer_config, recipe.named, recipe.template,
                              recipe.specials, recipe.eos, recipe.scale, recipe.unscaled, BUILD_VERSION,
                              mlx_vlm.__version__],
                             sort_keys=True)
    if recipe.scaled:  # only then: the other families' folders keep their names
        recipe_text += json.dumps(recipe.scaled, sort_keys=True)
    if recipe.packed is not None:  # the code that makes its packed weights: a change to it builds anew
        recipe_text += inspect.getsource(recipe.packed)
    return f"{family}-{hashlib.sha256(recipe_text.encode()).hexdigest()[:10]}"


def build(family: str, root: Path = None) -> str:
    """The directory of `family`'s tiny model, built once per machine (seeded: the same weights
    every time). KeyError: no recipe for it (vision_families.NOT_BUILT says why)."""
    import tempfile

    import mlx.core as mx

    recipe = RECIPES[family]
    root = Path(root) if root is not None else default_root()
    with tempfile.TemporaryDirectory() as scratch:  # the ids the config needs (training takes milliseconds)
        config = _config(family, recipe, _tokens(recipe, Path(scratch)))
    target = root / _recipe_name(family, config, recipe)
    with building(target) as tmp:
        if not (target / "model.safetensors").exists():
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            try:
                tok = _tokens(recipe, tmp)
                (tmp / "config.json").write_text(json.dumps(config, indent=1))
                for name, content in recipe.files.items():
                    (tmp / name).write_text(json.dumps(content, indent=1))
                mx.save_safetensors(str(tmp / "model.safetensors"), conditioned(family, recipe, config, tok))
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)  # nothing half-built is left in the cache folder
                raise
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
    return str(target)


if __name__ == "__main__":
    for name in sys.argv[1:] or sorted(RECIPES):
        print(name, build(name))
