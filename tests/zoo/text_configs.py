"""A tiny config for each text family: a generic shrink of its ModelArgs, plus a few overrides.

The generic shrink reads the family's own ModelArgs dataclass (and, for families that wrap
a language model in `text_config`, the language model's args): every size field it knows
by name (widths, depths, heads, experts, low ranks, windows) is set small where the field is
required or its default is a positive size (a feature the family's default turns off with 0
or None stays off), and another field with no default gets a plain value by name. The
OVERRIDES table holds what that cannot know: layer patterns (which layers attend, which are
recurrent) that must match the depth, dimensions that must divide each other, and the few
fields whose default a tiny model cannot take. mlx-lm's own tests build tiny configs of most
families; the facts here (which fields a family needs) agree with them, the values are ours.
"""

import dataclasses
import importlib
import inspect
import re

from zoo.text_families import module_of

WINDOW = 16  # sliding windows and attention chunks: a short prompt plus its reply passes them

# Sizes, by field name (a family's defaults are those of its full-size models).
SIZES = {
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "hidden_dim", "model_dim", "dim"), 64),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "n_layers", "num_layers", "num_transformer_layers"), 2),
    **dict.fromkeys(("intermediate_size", "ffn_hidden_size", "n_inner", "ff_intermediate_size",
                     "intermediate_size_mlp", "block_ff_dim"), 128),
    **dict.fromkeys(("moe_intermediate_size", "expert_ffn_hidden_size", "shared_expert_intermediate_size",
                     "shared_intermediate_size"), 32),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "num_heads", "num_query_heads"), 4),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads", "n_kv_heads", "num_attention_groups"), 2),
    "head_dim": 16,
    **dict.fromkeys(("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "moe_topk"), 2),
    **dict.fromkeys(("kv_lora_rank", "q_lora_rank"), 16),
    **dict.fromkeys(("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"), 8),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx", "block_size", "model_max_length"), 1024),
    **dict.fromkeys(("sliding_window", "sliding_window_size", "attention_window_size", "attention_chunk_size"),
                    WINDOW),
    # Layer patterns given as "every n-th layer": with 2 layers, one of each kind.
    **dict.fromkeys(("sliding_window_pattern", "full_attention_interval", "layer_group_size"), 2),
    **dict.fromkeys(("first_k_dense_replace", "num_dense_layers", "n_group", "topk_group"), 1),
    **dict.fromkeys(("kv_channels", "swa_head_dim", "swa_v_head_dim", "linear_key_head_dim",
                     "linear_value_head_dim", "mamba_head_dim", "mamba_d_head", "index_head_dim"), 16),
    **dict.fromkeys(("rotary_dim", "state_size", "ssm_state_size", "mamba_d_state"), 8),
    **dict.fromkeys(("moe_top_k", "num_experts_per_token", "n_shared_head", "linear_num_key_heads"), 2),
    **dict.fromkeys(("linear_num_value_heads", "mamba_num_heads", "mamba_n_heads", "swa_num_attention_heads"), 4),
    "swa_num_key_value_heads": 2,
    **dict.fromkeys(("share_expert_dim", "moe_shared_expert_intermediate_size", "moe_hidden_size"), 32),
    **dict.fromkeys(("a_low_rank_dim", "v_low_rank_dim", "gate_low_rank_dim", "decay_low_rank_dim",
                     "laurel_rank", "hidden_size_per_layer_input"), 8),
    "query_pre_attn_scalar": 16,  # = head_dim
    "global_head_dim": 32,
    "num_kv_shared_layers": 0,
}

# Set whenever the family has the field: rope_theta may default to None (qwen3 then refuses),
# and a head of its own is scaled without touching the input embedding (text_builder.py).
ALWAYS = {"rope_theta": 10000.0, "tie_word_embeddings": False}

# Values by field name for fields the family's class gives no default.
REQUIRED = {
    **dict.fromkeys(("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps", "layernorm_epsilon"),
                    1e-5),
    **dict.fromkeys(("rotary_emb_base", "swa_rope_theta", "rope_local_base_freq"), 10000.0),
    **dict.fromkeys(("attention_bias", "mlp_bias", "use_bias", "use_qkv_bias", "mamba_proj_bias",
                     "conv_bias", "use_expert_bias", "linear_allow_neg_eigval"), False),
    **dict.fromkeys(("use_qk_norm", "qk_norm", "post_norm", "norm_topk_prob", "use_conv_bias"), True),
    **dict.fromkeys(("n_shared_experts", "num_shared_experts", "num_shared_expert", "first_k_dense_replace",
                     "n_group", "topk_group", "decoder_sparse_step", "moe_layer_freq"), 1),
    **dict.fromkeys(("routed_scaling_factor", "logits_scaling", "attention_multiplier", "embedding_multiplier",
                     "residual_multiplier", "scale_emb", "scale_depth"), 1.0),
    "partial_rotary_factor": 0.5,
    "rotary_pct": 0.5,
    "mlp_only_layers": [],
    "rope_scaling": None,
    **dict.fromkeys(("conv_kernel", "linear_conv_kernel_dim", "conv1d_width", "mamba_d_conv"), 4),
    "conv_L_cache": 3,
    "n_groups": 1,
    **dict.fromkeys(("time_step_rank", "mamba_dt_rank"), 4),
    "time_step_limit": [0.001, 100.0],
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
}

# What the generic shrink cannot know, per family (a `text_config` entry is merged into the
# generic text config). Layer patterns are written for the 2 layers of the generic shrink.
_SLIDING_FULL = ["sliding_attention", "full_attention"]
_LFM2 = dict(conv_L_cache=3, block_dim=64, block_ff_dim=128, block_multiple_of=16, block_ffn_dim_multiplier=1.0,
             block_auto_adjust_ff_dim=False, layer_types=["conv", "full_attention"])
_LINEAR_ATTN = {"kda_layers": [1], "num_heads": 4, "head_dim": 16, "short_conv_kernel_size": 4}
_ROPE = {"rope_theta": 10000.0, "rope_type": "default"}
OVERRIDES = {
    "afm7": dict(num_kv_reuse_layers=1),
    "afmoe": dict(layer_types=_SLIDING_FULL),
    "baichuan_m1": dict(sliding_window_layers=[0], conv_window=2),
    "bailing_hybrid": dict(group_norm_size=1),
    "bailing_moe_linear": dict(group_norm_size=1),
    "dbrx": dict(ffn_config={"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2},
                 attn_config={"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 10000.0}),
    "deepseek_v41": dict(o_groups=2, o_lora_rank=16),
    "deepseek_v2": dict(rope_scaling={"type": "yarn", "factor": 1.0, "original_max_position_embeddings": 1024}),
    # transformers (which reads config.json for the tokenizer) wants the pattern's layer_types too
    "exaone4": dict(sliding_window_pattern="LG", layer_types=_SLIDING_FULL),
    "exaone_moe": dict(layer_types=_SLIDING_FULL, is_moe_layer=[False, True]),
    "gear": dict(layer_types=_SLIDING_FULL),
    "gemma3n": dict(text_config=dict(layer_types=_SLIDING_FULL, num_kv_shared_layers=0, final_logit_softcapping=30.0,
                                     activation_sparsity_pattern=[0.0, 0.0], altup_num_inputs=2,
                                     altup_coef_clip=120.0, altup_correct_scale=True, altup_active_idx=0)),
    "glm_moe_dsa": dict(index_n_heads=2, index_topk=8, rope_parameters=_ROPE),
    "falcon_h1": dict(mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16),
    "granitemoehybrid": dict(layer_types=["mamba", "attention"], mamba_proj_bias=False, mamba_conv_bias=True,
                             mamba_d_conv=4, mamba_n_groups=1, mamba_n_heads=8,  # 8 x 16 = 2 x hidden
                             mamba_d_head=16, mamba_d_state=8),
    "hunyuan": dict(use_mixed_mlp_moe=True, use_cla=False, cla_share_factor=2,
                    rope_scaling={"alpha": 1.0, "factor": 1.0, "type": "dynamic"}),
    "jamba": dict(attn_layer_offset=1, attn_layer_period=2, expert_layer_offset=1, expert_layer_period=2,
                  mamba_expand=2),
    "kimi_linear": dict(linear_attn_config=_LINEAR_ATTN),
    "kimi_k3": dict(text_config=dict(linear_attn_config=_LINEAR_ATTN, num_shared_experts=1, num_experts=4,
                                     moe_intermediate_size=32, kv_lora_rank=16, qk_nope_head_dim=8,
                                     qk_rope_head_dim=8, v_head_dim=8)),
    "lfm2": _LFM2,
    "lfm2-vl": dict(text_config=_LFM2),
    "lfm2_moe": dict(conv_L_cache=3, layer_types=["conv", "full_attention"]),
    # every 4th layer attends globally, the others in chunks: 4 layers have both
    "llama4": dict(text_config=dict(interleave_moe_layer_step=2, num_experts_per_tok=1, num_hidden_layers=4)),
    "llama4_text": dict(no_rope_layers=[1, 0]),
    "longcat_flash": dict(attention_method="MLA", zero_expert_type="identity", zero_expert_num=2,
                          mla_scale_q_lora=True, mla_scale_kv_lora=True),
    "longcat_flash_ngram": dict(zero_expert_num=2, mla_scale_q_lora=True, mla_scale_kv_lora=True,
                                ngram_vocab_size_ratio=2),
    "mamba2": dict(time_step_rank="auto", num_heads=8),  # transformers checks heads * head_dim = 2 * hidden
    "mellum": dict(layer_types=_SLIDING_FULL, rope_parameters={t: _ROPE for t in _SLIDING_FULL}),
    "mimo_v2_flash": dict(hybrid_layer_pattern=[1, 0], moe_layer_freq=[0, 1], add_swa_attention_sink_bias=True,
                          add_full_attention_sink_bias=False),
    "minicpm": dict(dim_model_base=64),
    "minicpm3": dict(dim_model_base=64, rope_scaling={"original_max_position_embeddings": 1024}),
    "ministral3": dict(rope_parameters=dict(_ROPE, llama_4_scaling_beta=0.1, original_max_position_embeddings=1024)),
    # mlx-lm runs mistral as llama; with a window on every other layer (Ministral's layout) the
    # llama code takes its sliding-window path: RotatingKVCache next to KVCache.
    "mistral": dict(sliding_window=WINDOW, layer_types=_SLIDING_FULL),
    "mistral3": dict(text_config=dict(model_type="ministral3", rope_parameters=dict(
        _ROPE, llama_4_scaling_beta=0.1, original_max_position_embeddings=1024))),
    "mistral4": dict(rope_parameters=dict(_ROPE, llama_4_scaling_beta=0.1, original_max_position_embeddings=1024)),
    "muse_spark": dict(text_config=dict(post_norm_eps=1e-5, rope_parameters=_ROPE, layer_rope_theta=[10000.0, 0],
                                        layer_types=_SLIDING_FULL, final_logit_softcapping=30.0,
                                        output_multiplier=1.0)),
    "nemotron": dict(hidden_act="relu2"),
    "nemotron-nas": dict(block_configs=[{"attention": {"n_heads_in_group": 2, "no_op": False,
                                                       "replace_with_linear": False},
                                         "ffn": {"ffn_mult": 1.5, "no_op": False, "replace_with_linear": False}}] * 2),
    "nemotron_h": dict(hybrid_override_pattern=["M", "*"]),
    "olmo3": dict(layer_types=_SLIDING_FULL),
    "olmo_hybrid": dict(layer_types=["linear_attention", "full_attention"]),
    "openelm": dict(num_query_heads=[4, 4], num_kv_heads=[2, 2], ffn_multipliers=[2.0, 2.0], ffn_dim_divisor=16),
    # Its forward pass sets the logits of ids 100256-100351 (its tokenizer's reserved ones) to
    # -inf: a smaller vocabulary is written out of bounds (MLX then crashes): its real size.
    "phi3small": dict(dense_attention_every_n_layers=2, gegelu_limit=20.0, vocab_size=100352, hidden_size=32),
    # A 2-bit Hadamard-rotated pack of qwen3_5: one packed linear (its input 128 wide, as packs need).
    "prism_hadamard_qwen35": dict(schema_version=1, tensor_namespace="mlx-lm-text",
                                  quantization={"bits": 2, "group_size": 128, "mode": "affine"},
                                  modules=[{"path": "model.layers.0.mlp.down_proj", "embedding": False,
                                            "dtype": "float16", "block": 0}]),
    "recurrent_gemma": dict(logits_soft_cap=30.0, block_types=["recurrent", "attention"]),
    "spark2_5": dict(layer_types=_SLIDING_FULL, rope_parameters={t: _ROPE for t in _SLIDING_FULL}),
}


REQUIRED_FIELD = object()


def _fields(args_class) -> dict:
    """name -> the dataclass's default for it (a factory's value), or REQUIRED_FIELD."""
    out = {}
    for f in dataclasses.fields(args_class):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        else:
            out[f.name] = REQUIRED_FIELD
    return out


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _shrink(args_class, vocab: int) -> dict:
    """A size replaces a positive default (a feature the family turns off with 0 or None stays
    off: qwen3_5's num_experts=0 is the dense model), a required field gets its value by name."""
    cfg, fields = {}, _fields(args_class)
    for name, default in fields.items():
        if name in ALWAYS:
            cfg[name] = ALWAYS[name]
        elif name in SIZES and (default is REQUIRED_FIELD or _positive(default)):
            cfg[name] = SIZES[name]
        elif default is REQUIRED_FIELD and name in REQUIRED:
            cfg[name] = REQUIRED[name]
    for name in ("vocab_size", "vocab_size_per_layer_input", "num_vocab"):
        if name in fields:
            cfg[name] = vocab
    return cfg


def text_args(module):
    """The args class of the language model a `text_config` family wraps: a Text* args class of
    its module (or of the module its ModelArgs derives from), else the ModelArgs of the module
    its source builds from `args.text_config`."""
    from mlx_lm.models.base import BaseModelArgs

    bases = [inspect.getmodule(c.__mro__[1]) for c in (module.ModelArgs, module.Model)]
    for mod in dict.fromkeys([module, *bases]):
        for name, obj in vars(mod).items():
            if name.startswith("Text") and inspect.isclass(obj) and issubclass(obj, BaseModelArgs):
                return obj
        found = re.search(r"(\w+)\.ModelArgs\.from_dict\(\s*args\.text_config", inspect.getsource(mod))
        if found:
            return importlib.import_module(f"mlx_lm.models.{found.group(1)}").ModelArgs
    raise LookupError(f"no language model args found in {module.__name__}")


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out.get(key) or {}, value) if isinstance(value, dict) and key == "text_config" else value
    return out


def config_of(family: str, vocab: int) -> dict:
    """The tiny config.json of `family` for a tokenizer of `vocab` tokens."""
    module = importlib.import_module(f"mlx_lm.models.{module_of(family)}")
    cfg = dict(_shrink(module.ModelArgs, vocab), model_type=family)
    if "text_config" in _fields(module.ModelArgs):
        args = text_args(module)
        text = _shrink(args, vocab)
        text["model_type"] = args.__module__.rsplit(".", 1)[-1] if args.__name__ == "ModelArgs" else family
        cfg["text_config"] = text
    for name in dict.fromkeys([module_of(family), family]):
        cfg = _merge(cfg, OVERRIDES.get(name, {}))
    return cfg
