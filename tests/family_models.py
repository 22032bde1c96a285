"""Tiny random-weight text models of many families, built with mlx-lm's own classes.

Each is a seeded, float32, few-MB directory with the embedded SmolLM2
tokenizer: the same architecture code a real checkpoint of that family runs
through, small enough that a test can load and generate in well under a
second. Sliding-window families get a 16-token window so a short prompt fills
it. The end-of-sequence rows of the output head are scaled down so greedy
decoding never stops early.
"""

import hashlib
import json
import os
import shutil
from pathlib import Path

from models import building

BUILD_VERSION = 1  # bump when the weights recipe below changes
WINDOW = 16  # sliding window of the windowed families
_COMMON = dict(hidden_size=32, num_hidden_layers=2, intermediate_size=64, num_attention_heads=4,
               num_key_value_heads=2, rms_norm_eps=1e-5, max_position_embeddings=4096)

CONFIGS = {
    "llama": dict(model_type="llama", tie_word_embeddings=False),
    "mistral": dict(model_type="mistral", tie_word_embeddings=False, sliding_window=WINDOW,
                    layer_types=["sliding_attention", "full_attention"]),
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=False),
    "qwen3": dict(model_type="qwen3", head_dim=8, rope_theta=10000.0, tie_word_embeddings=False),
    "phi3": dict(model_type="phi3", tie_word_embeddings=False),
    "gemma3_text": dict(model_type="gemma3_text", head_dim=8, query_pre_attn_scalar=8, sliding_window=WINDOW,
                        sliding_window_pattern=2),
    "qwen3_moe": dict(model_type="qwen3_moe", head_dim=8, num_experts=4, num_experts_per_tok=2,
                      decoder_sparse_step=1, mlp_only_layers=[], moe_intermediate_size=32, rope_theta=10000.0,
                      tie_word_embeddings=False, norm_topk_prob=True),
    "gpt_oss": dict(model_type="gpt_oss", head_dim=8, num_local_experts=4, num_experts_per_tok=2,
                    sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"]),
    "lfm2": dict(model_type="lfm2", norm_eps=1e-5, conv_bias=False, conv_L_cache=3, block_dim=32,
                 block_multiple_of=16, block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=False,
                 block_ff_dim=64, layer_types=["conv", "full_attention"]),
    "qwen3_next": dict(model_type="qwen3_next", linear_num_value_heads=4, linear_num_key_heads=2,
                       linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=4,
                       num_experts_per_tok=2, decoder_sparse_step=1, shared_expert_intermediate_size=32,
                       mlp_only_layers=[], moe_intermediate_size=32, rope_theta=10000.0,
                       partial_rotary_factor=0.5, head_dim=8, full_attention_interval=2),
}
FAMILIES = list(CONFIGS)
TIED = {"lfm2"}  # families whose output head is always the embedding


def _tokenizer_source() -> Path:
    from loaders.gguf_loader import gguf_to_mlx_dir
    from loaders.model_loader import embedded_default

    return gguf_to_mlx_dir(embedded_default())


def _default_root() -> Path:
    from models import models_root

    return models_root() / "families"


def config_of(family: str, vocab_size: int) -> dict:
    cfg = dict(_COMMON, vocab_size=vocab_size, **CONFIGS[family])
    cfg["eos_token_id"] = 2
    return cfg


def build(family: str, root: Path = None, sizes: dict = None) -> str:
    """The directory of `family`'s tiny model, built once (seeded: the same weights every time).
    `sizes` overrides config entries (the benches build wider, deeper ones)."""
    root = Path(root) if root is not None else _default_root()
    vocab = json.loads((_tokenizer_source() / "config.json").read_text())["vocab_size"]
    return build_from(family, dict(config_of(family, vocab), **(sizes or {})), root)


def build_from(name: str, cfg: dict, root: Path, boost: float = None) -> str:
    """The directory of a tiny model of config `cfg` under `root`, built once with mlx-lm's own
    classes (seeded by `name`), with the embedded model's tokenizer; `boost` scales every
    weight matrix but the vocabulary's (default: 4 for the TIED families, else none)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    src = _tokenizer_source()
    vocab = cfg["vocab_size"] if "vocab_size" in cfg else cfg["text_config"]["vocab_size"]
    # The name carries the recipe: a changed config or scaling is a new directory.
    recipe = json.dumps([cfg, sorted(TIED) if boost is None else boost, BUILD_VERSION], sort_keys=True)
    boost = boost if boost is not None else 4 if name in TIED else 1
    target = root / f"{name}-{hashlib.sha256(recipe.encode()).hexdigest()[:10]}"
    with building(target) as tmp:
        if not (target / "model.safetensors").exists():
            model_class, args_class = _get_classes(cfg)
            mx.random.seed(sum(map(ord, name)))
            model = model_class(args_class.from_dict(cfg))
            weights = dict(tree_flatten(model.parameters()))
            # SmolLM2's <|endoftext|>, <|im_start|>, <|im_end|> (ids 0-2) far from everything in the output
            # head (and, tied, as inputs, which the tests never send): greedy never picks them.
            damp = (mx.arange(vocab) >= 3).astype(mx.float32)[:, None] * 0.99 + 0.01
            for key, w in weights.items():
                if w.ndim == 2 and w.shape[0] == vocab and ("lm_head" in key or "embed" in key or "wte" in key):
                    weights[key] = w * damp
                elif boost != 1 and w.ndim >= 2:
                    # Tied output head: with the default small layers each token's own embedding
                    # dominates and greedy repeats the input; stronger layers make it move.
                    weights[key] = w * boost
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            mx.save_safetensors(str(tmp / "model.safetensors"), {k: v.astype(mx.float32) for k, v in weights.items()})
            (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
            for file in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
                if (src / file).exists():
                    shutil.copyfile(src / file, tmp / file)
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
    return str(target)


if __name__ == "__main__":  # build them all: python tests/family_models.py [root]
    import sys

    sys.path[:0] = [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "backend")]
    for f in FAMILIES:
        print(build(f, Path(sys.argv[1]) if len(sys.argv) > 1 else None))
