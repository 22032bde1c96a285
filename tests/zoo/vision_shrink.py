"""A generic shrink of a vision-language family's config: every size field its own config
classes declare, made tiny.

The table names fields as mlx-vlm's config dataclasses spell them; a family's recipe
(vision_recipes.py) starts from `shrink(module.TextConfig)` / `shrink(module.VisionConfig)`
and overrides what this cannot know (token ids, a family's own layout rules).
"""

import dataclasses

WIDTH = 32  # text hidden size; the vision tower projects into it

TEXT = {
    "hidden_size": WIDTH, "intermediate_size": 2 * WIDTH, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
    "rms_norm_eps": 1e-6, "layer_norm_eps": 1e-6, "max_position_embeddings": 4096,
    "rope_theta": 10000.0, "tie_word_embeddings": False,
    # mixtures of experts
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": WIDTH, "shared_expert_intermediate_size": WIDTH,
    "decoder_sparse_step": 1, "mlp_only_layers": [],
    "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0,
    "first_k_dense_replace": 1, "norm_topk_prob": True,
    # multi-head latent attention
    "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
    # linear attention (gated delta)
    "linear_num_value_heads": 2, "linear_num_key_heads": 1, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "full_attention_interval": 2,
}

VISION = {
    "depth": 1, "num_hidden_layers": 1, "hidden_size": WIDTH, "embed_dim": WIDTH,
    "intermediate_size": 2 * WIDTH, "num_heads": 2, "num_attention_heads": 2,
    "out_hidden_size": WIDTH, "projection_dim": WIDTH, "layer_norm_eps": 1e-6,
}


def shrink(config_class, table: dict = None, **overrides) -> dict:
    """The fields of `config_class` that `table` (TEXT when it is a text config, else VISION)
    names, at their tiny values, then `overrides`."""
    names = {f.name for f in dataclasses.fields(config_class)}
    table = table if table is not None else (VISION if "Vision" in config_class.__name__ else TEXT)
    return {**{k: v for k, v in table.items() if k in names}, **overrides}
