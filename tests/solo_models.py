"""Tiny random-weight models of the families the solo lane serves, one per cause the lane
choice at load (backend/engine/lane_choice.py) sees, built with mlx-lm's own classes.

- llama4: its chunked-attention layers keep a ChunkedKVCache, which mlx-lm's batch cannot merge;
- deepseek_v41: its LayerCache is a class outside mlx-lm's cache protocol (no merge at all);
- gemma2: mlx-lm's batched step raises with three rows ([broadcast_shapes] in its attention);
- gpt_bigcode: its batched step raises (its positions are read as one Python integer);
- mamba: a recurrent state; mlx-lm's batch pads the shorter prompt into it and gives other
  text, but each prompt prefilled alone and merged to decode is exact (the batch's other mode).

Each is seeded and built once per machine into the tests' model cache (family_models.build_from),
with the embedded SmolLM2 tokenizer; `boost` scales the layers where a small random model
would otherwise repeat one token whatever the prompt.
"""

from pathlib import Path

from family_models import _default_root, _tokenizer_source, build_from

_ATTENTION = dict(hidden_size=32, num_hidden_layers=2, intermediate_size=64, num_attention_heads=4,
                  num_key_value_heads=2, rms_norm_eps=1e-5, max_position_embeddings=4096)

CONFIGS = {
    "llama4": dict(model_type="llama4", text_config=dict(
        model_type="llama4_text", attention_bias=False, attention_chunk_size=8, head_dim=8, hidden_size=32,
        interleave_moe_layer_step=2, intermediate_size=32, intermediate_size_mlp=64, max_position_embeddings=4096,
        num_attention_heads=4, num_experts_per_tok=1, num_hidden_layers=4, num_key_value_heads=2,
        num_local_experts=2, rms_norm_eps=1e-5, rope_scaling=None, rope_theta=10000.0, use_qk_norm=True)),
    "deepseek_v41": dict(model_type="deepseek_v41", hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         head_dim=16, q_lora_rank=16, qk_rope_head_dim=8, o_groups=2, o_lora_rank=16,
                         moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, sliding_window=8,
                         hc_mult=2, hc_sinkhorn_iters=3, index_n_heads=2, index_head_dim=8, index_topk=4,
                         candidate_topk_blocks=2, max_position_embeddings=4096, rms_norm_eps=1e-6),
    "gemma2": dict(_ATTENTION, model_type="gemma2", head_dim=8, query_pre_attn_scalar=8),
    "gpt_bigcode": dict(model_type="gpt_bigcode", n_embd=32, n_layer=2, n_inner=64, n_head=4, n_positions=4096,
                        layer_norm_epsilon=1e-5, bos_token_id=1),
    "mamba": dict(model_type="mamba", hidden_size=32, intermediate_size=64, state_size=8, num_hidden_layers=2,
                  conv_kernel=4, use_bias=False, use_conv_bias=True, time_step_rank=4),
}
BOOST = {"mamba": 4}
FAMILIES = list(CONFIGS)


def build(family: str) -> str:
    """The directory of `family`'s tiny model, built once (seeded)."""
    import json

    vocab = json.loads((_tokenizer_source() / "config.json").read_text())["vocab_size"]
    cfg = dict(CONFIGS[family], eos_token_id=2)
    if "text_config" in cfg:
        cfg["text_config"] = dict(cfg["text_config"], vocab_size=vocab)
    else:
        cfg["vocab_size"] = vocab
    return build_from(family, cfg, Path(_default_root()).with_name("solo-families"), boost=BOOST.get(family, 1))
