"""A tiny config for each family mlx-lm can divide over ranks: the zoo's config, widened to divide by 2 and 3.

The text zoo's configs (text_configs.py) have 4 attention heads, 2 KV heads and 2 layers: they
divide over 2 ranks at most, and a pipeline over 3 ranks has no layer for one of them. Here every
count a split cuts (attention and KV heads, recurrent heads, experts, MLP widths) becomes a
multiple of 6 and the depth becomes 6, each layer pattern of the 2-layer config repeated three
times: over 2 or 3 ranks, tensor parallelism gives each rank whole heads and experts, and pipeline
parallelism gives each stage layers of every kind the model has (so a stage keeps the caches the
whole model keeps). The widths are the zoo's values times 1.5, the head size kept.

Which families are candidates is read from the package's files (collection must not import MLX):
a family whose module, or a module it builds from, defines `shard(` or mixes in `PipelineMixin`.
What the library can really do with a built model (mlx-lm's own test: `hasattr(model, "shard")`,
`hasattr(model.model, "pipeline")`, as `sharded_load` asks) is decided when it is built.
"""

import re
from functools import lru_cache

from zoo import text_configs, text_families

RANKS = (2, 3)
DEPTH = 6  # a multiple of every group size here, and three repeats of the 2-layer patterns

# field name -> (the zoo's value, the widened one); a field holding another value keeps it.
WIDEN = {
    **dict.fromkeys(("hidden_size", "d_model", "dim", "model_dim"), (64, 96)),
    **dict.fromkeys(("num_hidden_layers", "num_layers", "n_layers"), (2, DEPTH)),
    **dict.fromkeys(("intermediate_size", "ffn_hidden_size"), (128, 192)),
    **dict.fromkeys(("moe_intermediate_size", "expert_ffn_hidden_size", "shared_expert_intermediate_size",
                     "shared_intermediate_size", "share_expert_dim", "moe_hidden_size",
                     "moe_shared_expert_intermediate_size"), (32, 48)),
    **dict.fromkeys(("num_attention_heads", "n_heads", "num_heads", "swa_num_attention_heads"), (4, 12)),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads", "n_kv_heads", "num_attention_groups",
                     "swa_num_key_value_heads", "linear_num_key_heads", "index_n_heads", "o_groups"), (2, 6)),
    "linear_num_value_heads": (4, 12),
    **dict.fromkeys(("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts"), (4, 6)),
}
# Per-layer lists written for 2 layers: repeated to DEPTH.
PATTERNS = ("layer_types", "is_moe_layer", "layer_rope_theta", "hybrid_layer_pattern", "no_rope_layers")
# Lists of layer indices (one of each 2): every such index of each repeat.
INDICES = ("kda_layers", "sliding_window_layers")


def widen(cfg: dict) -> dict:
    out = {}
    for key, value in cfg.items():
        if isinstance(value, dict):
            out[key] = widen(value)
        elif key in WIDEN and value == WIDEN[key][0]:
            out[key] = WIDEN[key][1]
        elif key in PATTERNS and isinstance(value, list) and len(value) == 2:
            out[key] = value * (DEPTH // 2)
        elif key in INDICES and isinstance(value, list):
            out[key] = [i + 2 * r for r in range(DEPTH // 2) for i in value]
        else:
            out[key] = value
    return out


# What the widening cannot know: a 2-bit pack needs input widths of a multiple of 128 (its
# packed down projection reads the MLP width, cut in 2 or 3 under tensor parallelism).
OVERRIDES = {"prism_hadamard_qwen35": {"text_config": {"intermediate_size": 768}}}


def config_of(family: str, vocab: int) -> dict:
    """The widened tiny config.json of `family` for a tokenizer of `vocab` tokens."""
    cfg = widen(text_configs.config_of(family, vocab))
    for key, value in OVERRIDES.get(family, {}).items():
        cfg[key] = dict(cfg.get(key) or {}, **value) if isinstance(value, dict) else value
    return cfg


def _source(module: str) -> str:
    return (text_families._package() / "models" / f"{module}.py").read_text()


@lru_cache(maxsize=None)
def _divides(module: str, seen: frozenset = frozenset()) -> bool:
    source = _source(module)
    if "def shard(" in source or "PipelineMixin" in source:
        return True
    named = re.findall(r"^from \.(\w+) import", source, re.M) + re.findall(r"^from \. import (\w+)", source, re.M)
    bases = set(named) - seen - {module, "base", "cache", "activations", "rope_utils", "switch_layers"}
    return any(_divides(b, seen | {module}) for b in bases if (text_families._package() / "models" / f"{b}.py").exists())


@lru_cache(maxsize=None)
def candidates() -> tuple:
    """The families whose code can divide a model (tensor or pipeline parallel), sorted. An alias
    mlx-lm maps onto another family's module with the zoo's same config (kimi_k2 onto
    deepseek_v3) runs the same code on the same weights: its target stands for it."""
    remap = text_families.remapping()
    out = []
    for family in text_families.families():
        module = text_families.module_of(family)
        if not _divides(module):
            continue
        if family in remap and family not in text_configs.OVERRIDES and remap[family] in text_families.families():
            continue  # an alias with its target's config
        out.append(family)
    return tuple(out)
