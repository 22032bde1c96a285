"""LoRA test models: a tiny random model, random adapters in mlx-lm's directory format, and
the oracles for "base + adapters": model directories whose weights had the adapters added in
numpy (W + scale * (A @ B)^T, in float64), loaded as plain models. Shared by the LoRA tests in
one process and across ranks."""

import json
import shutil

import numpy as np

import backend_pb2

PROMPTS = ["Once upon a time", "The capital of France is"]
RANK = 4
# Adapted linears; lora_a is (in, r), lora_b is (r, out), as mlx-lm's LoRALinear stores them.
TARGETS = [f"model.layers.{i}.{name}" for i in (0, 1)
           for name in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")]
CONFIG = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
              num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=49152,
              tie_word_embeddings=True, max_position_embeddings=2048, eos_token_id=[2])


def _write_model(path, weights, config):
    import mlx.core as mx

    path.mkdir()
    mx.save_safetensors(str(path / "model.safetensors"), {k: mx.array(v) for k, v in weights.items()})
    (path / "config.json").write_text(json.dumps(config))
    from loaders.gguf_loader import gguf_to_mlx_dir
    from loaders.model_loader import embedded_default

    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(gguf_to_mlx_dir(embedded_default()) / name, path / name)


def _write_adapter(path, tensors, scale):
    import mlx.core as mx

    path.mkdir()
    mx.save_safetensors(str(path / "adapters.safetensors"), {k: mx.array(v) for k, v in tensors.items()})
    (path / "adapter_config.json").write_text(json.dumps({
        "fine_tune_type": "lora", "num_layers": 2,
        "lora_parameters": {"rank": RANK, "scale": scale, "dropout": 0.0}}))


def _random_adapter(rng, shapes):
    """lora_a / lora_b for each target, lora_b non-zero (a freshly initialised adapter has B = 0)."""
    out = {}
    for name in TARGETS:
        out_dims, in_dims = shapes[name]
        out[f"{name}.lora_a"] = rng.uniform(-1, 1, (in_dims, RANK)).astype(np.float32) / np.sqrt(in_dims)
        out[f"{name}.lora_b"] = rng.normal(0, 0.5, (RANK, out_dims)).astype(np.float32)
    return out


def _fused(weights, adapters):
    """The oracle: each (tensors, adapter scale, host scale) added into the float weights."""
    fused = {k: v.astype(np.float64) for k, v in weights.items()}
    for tensors, own, host in adapters:
        for name in TARGETS:
            a, b = tensors[f"{name}.lora_a"].astype(np.float64), tensors[f"{name}.lora_b"].astype(np.float64)
            fused[f"{name}.weight"] += own * host * (a @ b).T
    return {k: v.astype(np.float32) for k, v in fused.items()}


def build_folder(root, family: str = "llama"):
    """The models folder under `root`: base (float), qbase (4-bit), adapters ad1, ad2 and wide,
    and the fused oracles fused1, fused12, qfused1. `family`: llama, or another of mlx-lm's
    families with the same layer names (qwen2: mlx-lm pipelines it)."""
    import importlib

    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    config = dict(CONFIG, model_type=family)
    module = importlib.import_module(f"mlx_lm.models.{family}")
    mx.random.seed(7)
    model = module.Model(module.ModelArgs.from_dict(config))
    base = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    _write_model(root / "base", base, config)
    rng = np.random.default_rng(0)
    shapes = {name: base[f"{name}.weight"].shape for name in TARGETS}
    one, two = _random_adapter(rng, shapes), _random_adapter(rng, shapes)
    _write_adapter(root / "ad1", one, 2.0)
    _write_adapter(root / "ad2", two, 1.0)
    _write_model(root / "fused1", _fused(base, [(one, 2.0, 1.5)]), config)
    _write_model(root / "fused12", _fused(base, [(one, 2.0, 0.5), (two, 1.0, 2.0)]), config)
    # A 4-bit copy of the base, and its oracle: the dequantized weights plus the adapter.
    nn.quantize(model, group_size=32, bits=4)
    qweights = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    _write_model(root / "qbase", qweights, dict(config, quantization={"group_size": 32, "bits": 4}))
    dequantized = {}
    for k, v in qweights.items():
        stem, leaf = k.rsplit(".", 1)
        if leaf == "weight" and f"{stem}.scales" in qweights:
            dequantized[k] = np.array(mx.dequantize(
                mx.array(v), mx.array(qweights[f"{stem}.scales"]), mx.array(qweights[f"{stem}.biases"]),
                group_size=32, bits=4))
        elif leaf not in ("scales", "biases"):
            dequantized[k] = v
    _write_model(root / "qfused1", _fused(dequantized, [(one, 2.0, 1.0)]), config)
    # Made for a model twice as wide: every pair has the wrong shape.
    _write_adapter(root / "wide", {k: np.concatenate([v, v], axis=0 if k.endswith("lora_a") else 1)
                                   for k, v in one.items()}, 2.0)
    return root


def run(backend):
    """Greedy token ids and logprobs of each prompt."""
    out = []
    for prompt in PROMPTS:
        reply = backend.stub.Predict(backend_pb2.PredictOptions(Prompt=prompt, Tokens=12, Logprobs=1), timeout=120)
        content = json.loads(reply.logprobs)["content"]
        out.append(([e["id"] for e in content], [e["logprob"] for e in content]))
    return out


def same(a, b) -> bool:
    """The same greedy tokens, and logprobs equal up to float rounding."""
    return all(ia == ib and np.allclose(la, lb, atol=2e-3) for (ia, la), (ib, lb) in zip(a, b))
