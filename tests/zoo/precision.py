"""The zoo's tiny text models at the precisions users run: bf16, affine q8 and q4, mxfp4.

Each variant is made from the family's tiny float32 model (text_builder.py) the way a user's
checkpoint is: bf16 is the float32 weights cast to bfloat16, as a released bf16 checkpoint
holds them (config `torch_dtype` says so); q8 and q4 (affine, group size 64) and mxfp4
(group size 32) are quantized from that bf16 variant, as `mlx_lm.convert -q` makes them from
a bf16 checkpoint. The making is mlx-lm's own: `mlx_lm.convert.convert`, which casts, calls
`quantize_model` (with the family's own `quant_predicate`: MoE routers stay affine 8-bit) and
writes with `save`. Nothing here quantizes by itself.

mlx-lm leaves a layer unquantized when the group size does not divide its input width. The
zoo's experts are 32 wide, so at group size 64 the MoE families' expert (and shared expert)
down projections would stay bf16, which real checkpoints do not have (Qwen3-30B-A3B's experts
are 768 wide), and which the library cannot run on the CPU (its GatherMM takes float32 only)
where the fully quantized model runs. Those families are built here from the zoo's recipe with the
widths in FIT_GROUP; `check` refuses a variant with any layer left unquantized.

Built once per machine into the models cache, one folder per family and precision named by
its recipe (the float32 model's folder, which names the zoo's recipe, the quantization, this
builder's version, mlx and mlx-lm's versions), built in a temporary folder and renamed under a
lock, so concurrent test runs share it. A variant is kept only when `mlx_lm.load` loads it
and its weights have the intended dtype and quantization.
"""

import contextlib
import hashlib
import io
import json
import shutil
from pathlib import Path

from models import building, models_root
from zoo import text_builder, text_configs, text_families

BUILD_VERSION = 1  # bump when the recipe below changes

PRECISIONS = ("bf16", "q8", "q4", "mxfp4")

# What each precision passes to mlx_lm.convert.convert, besides the source and the output.
RECIPES = {
    "bf16": dict(dtype="bfloat16"),
    "q8": dict(quantize=True, q_mode="affine", q_bits=8, q_group_size=64),
    "q4": dict(quantize=True, q_mode="affine", q_bits=4, q_group_size=64),
    "mxfp4": dict(quantize=True, q_mode="mxfp4", q_bits=4, q_group_size=32),
}

# One family of each kind the server treats differently: dense, sliding window, convolutional
# hybrid, linear-attention hybrid (with experts), and two MoE.
FAMILIES = ("llama", "gemma3_text", "lfm2", "qwen3_next", "qwen3_moe", "gpt_oss")

# The zoo's config widths a group size of 64 does not divide, widened to 64 (gpt_oss's
# experts take intermediate_size, 128, and fit as they are).
FIT_GROUP = {
    "qwen3_moe": dict(moe_intermediate_size=64),
    "qwen3_next": dict(moe_intermediate_size=64, shared_expert_intermediate_size=64),
}

# Files of the source's tokenizer, copied as they are: the variants must read every prompt
# into the same ids as the float32 model (convert's `save` rewrites them through transformers).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


class NotBuilt(Exception):
    """The family's float32 model is not there to make variants from (the zoo says why)."""


def root() -> Path:
    return models_root() / "precision"


def variant(family: str, precision: str) -> str:
    """The folder of the family's tiny model at `precision`, built once."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {PRECISIONS}")
    bf16 = _made(family, _float32(family), "bf16")
    return str(bf16 if precision == "bf16" else _made(family, bf16, precision))


def _float32(family: str) -> Path:
    if family in FIT_GROUP:
        return _widened(family, FIT_GROUP[family])
    built = text_builder.build_all([family])[0]
    if built.status != "built":
        raise NotBuilt(f"{family}: the zoo has no float32 model of it ({built.status}: {built.reason})")
    return Path(built.path)


def _widened(family: str, widths: dict) -> Path:
    """The zoo's float32 model of `family` with `widths` in its config, built and conditioned
    by the zoo's own code, with the zoo's tokenizer. Built in this process, not in a worker as
    text_builder builds: the families widened here are ones the zoo builds without trouble."""
    tokenizer = text_builder.tokenizer_dir(text_builder.default_root())
    cfg = dict(text_configs.config_of(family, text_builder._n_tokens(tokenizer)),
               eos_token_id=text_builder._eos_id(tokenizer), **widths)
    target = root() / f"{family}-float32-{_digest([cfg, text_builder.BUILD_VERSION, text_families.version()])}"
    with building(target) as tmp:
        if (target / "model.safetensors").exists():
            return target
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            text_builder._make(family, cfg, tokenizer, tmp)
        except Exception:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    return target


def _versions() -> list:
    from importlib.metadata import version

    return [version("mlx"), version("mlx-lm")]


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:10]


def _made(family: str, source: Path, precision: str) -> Path:
    """`source` converted to `precision` into the cache, unless it is there already. The
    source's folder name carries its own recipe's digest, so it stands for the source here."""
    recipe = [source.name, RECIPES[precision], BUILD_VERSION, _versions()]
    target = root() / f"{family}-{precision}-{_digest(recipe)}"
    with building(target) as tmp:
        if (target / "config.json").exists():
            return target
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            _convert(source, tmp, precision)
            check(tmp, precision)
        except Exception:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    return target


def _convert(source: Path, out: Path, precision: str) -> None:
    from mlx_lm.convert import convert
    from mlx_lm.utils import save_config

    # convert reports its progress on stdout; a test's output has no use for it
    with contextlib.redirect_stdout(io.StringIO()):
        convert(str(source), str(out), **RECIPES[precision])
    if precision == "bf16":
        # convert casts the weights but leaves the config as it was; a bf16 checkpoint says
        # what it holds, and convert reads it back as the dtype to keep when quantizing
        config = json.loads((out / "config.json").read_text())
        save_config(dict(config, torch_dtype="bfloat16"), out / "config.json")
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copyfile(source / name, out / name)


def quantized_layers(model) -> dict:
    """{layer path: (mode, bits, group size)} of the layers that can be quantized (they have
    `to_quantized`, or are already), None for one that is not."""
    layers = {}
    for path, m in model.named_modules():
        if "scales" in m:
            layers[path] = (m.mode, m.bits, m.group_size)
        elif hasattr(m, "to_quantized") and "weight" in m:
            layers[path] = None
    return layers


def check(path: Path, precision: str) -> None:
    """Raise unless `mlx_lm.load` loads `path` with the precision's weights: every float
    parameter bfloat16; when quantized, every layer quantized, in the recipe's mode or in the
    one the family's own predicate chose for it (the config names it)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load

    model, _, config = load(str(path), return_config=True)
    # affine keeps its scales and biases in the weights' dtype, mxfp4 its scales as uint8:
    # either way no float parameter is left in float32
    wrong = [name for name, v in tree_flatten(model.parameters())
             if mx.issubdtype(v.dtype, mx.floating) and v.dtype != mx.bfloat16]
    if wrong:
        raise RuntimeError(f"{path.name}: not bfloat16 after mlx_lm.load: {wrong[:5]}")
    if precision == "bf16":
        return
    recipe = RECIPES[precision]
    intended = (recipe["q_mode"], recipe["q_bits"], recipe["q_group_size"])
    modules = dict(model.named_modules())
    for layer, got in quantized_layers(model).items():
        chosen = config["quantization"].get(layer)
        expected = intended if not isinstance(chosen, dict) else (
            chosen.get("mode", "affine"), chosen["bits"], chosen["group_size"])
        if got is None:
            width = modules[layer].weight.shape[-1]
            raise RuntimeError(f"{path.name}: {layer} is not quantized: {width} wide, group size "
                               f"{recipe['q_group_size']} (widen the config in FIT_GROUP)")
        if got != expected:
            raise RuntimeError(f"{path.name}: {layer} is {got}, not {expected}")


def library_cannot(path: str) -> str:
    """Why mlx-lm itself cannot generate from the variant at `path` here, "" when it can: the
    library's own load and two greedy tokens of its stream_generate, so a refusal is expected
    from the server only where the library fails too (MoE experts in bfloat16 on the CPU:
    "[GatherMM::eval] Currently only supports float32.")."""
    from mlx_lm import load, stream_generate

    try:
        model, tokenizer = load(path)
        for _ in stream_generate(model, tokenizer, text_builder.PROBE, max_tokens=2):
            pass
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return ""
