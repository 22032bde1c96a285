"""End to end: LoRA adapters applied at LoadModel, through the real server.

A tiny random llama (SmolLM2's tokenizer) and random adapters in mlx-lm's
directory format are written here; the oracle for "base + adapters" is a
model directory whose weights had the adapters added in numpy
(W + scale * (A @ B)^T, in float64), loaded as a plain model.
"""

import json
import shutil

import numpy as np
import pytest

import backend_pb2
from conftest import serving

pytestmark = pytest.mark.e2e

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


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The models folder: base (float), qbase (4-bit), adapters, and the fused oracles."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    root = tmp_path_factory.mktemp("lora_models")
    mx.random.seed(7)
    model = llama.Model(llama.ModelArgs.from_dict(CONFIG))
    base = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    _write_model(root / "base", base, CONFIG)
    rng = np.random.default_rng(0)
    shapes = {name: base[f"{name}.weight"].shape for name in TARGETS}
    one, two = _random_adapter(rng, shapes), _random_adapter(rng, shapes)
    _write_adapter(root / "ad1", one, 2.0)
    _write_adapter(root / "ad2", two, 1.0)
    _write_model(root / "fused1", _fused(base, [(one, 2.0, 1.5)]), CONFIG)
    _write_model(root / "fused12", _fused(base, [(one, 2.0, 0.5), (two, 1.0, 2.0)]), CONFIG)
    # A 4-bit copy of the base, and its oracle: the dequantized weights plus the adapter.
    nn.quantize(model, group_size=32, bits=4)
    qweights = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    _write_model(root / "qbase", qweights, dict(CONFIG, quantization={"group_size": 32, "bits": 4}))
    dequantized = {}
    for k, v in qweights.items():
        stem, leaf = k.rsplit(".", 1)
        if leaf == "weight" and f"{stem}.scales" in qweights:
            dequantized[k] = np.array(mx.dequantize(
                mx.array(v), mx.array(qweights[f"{stem}.scales"]), mx.array(qweights[f"{stem}.biases"]),
                group_size=32, bits=4))
        elif leaf not in ("scales", "biases"):
            dequantized[k] = v
    _write_model(root / "qfused1", _fused(dequantized, [(one, 2.0, 1.0)]), CONFIG)
    # Made for a model twice as wide: every pair has the wrong shape.
    _write_adapter(root / "wide", {k: np.concatenate([v, v], axis=0 if k.endswith("lora_a") else 1)
                                   for k, v in one.items()}, 2.0)
    return root


@pytest.fixture(scope="module")
def lora(folder, log_dir):
    yield from serving(log_dir / "lora.log", "base", ModelPath=str(folder))


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


def load(backend, folder, model, **fields):
    result = backend.load(model, ModelPath=str(folder), **fields)
    assert result.success, result.message
    return run(backend)


def test_adapters_equal_their_weights_fused_in(lora, folder):
    plain = load(lora, folder, "base")
    fused1 = load(lora, folder, "fused1")
    assert [ids for ids, _ in fused1] != [ids for ids, _ in plain]  # the adapter changes the text
    # Relative adapter paths resolve under ModelPath, as the model's does.
    assert same(load(lora, folder, "base", LoraAdapter="ad1", LoraScale=1.5), fused1)

    fused12 = load(lora, folder, "fused12")
    two = load(lora, folder, "base", LoraAdapters=["ad1", str(folder / "ad2")], LoraScales=[0.5, 2.0])
    assert same(two, fused12)
    assert not same(two, fused1)


def test_an_adapter_on_a_quantized_model_keeps_it_quantized(lora, folder):
    oracle = load(lora, folder, "qfused1")
    assert same(load(lora, folder, "qbase", DType="native", LoraAdapter="ad1"), oracle)


def test_a_bad_or_mismatched_adapter_fails_the_load_and_the_old_model_serves(lora, folder):
    serving_now = load(lora, folder, "base", LoraAdapter="ad1", LoraScale=1.5)
    for fields, words in ((dict(LoraAdapter="missing"), "not found"),
                          (dict(LoraAdapters=["ad1", "wide"]), "does not fit"),
                          (dict(LoraAdapter="base"), "adapter_config.json"),  # a model, not an adapter
                          (dict(LoraAdapters=["ad1"], LoraScales=[1.0, 2.0]), "LoraScales")):
        result = lora.load("base", ModelPath=str(folder), **fields)
        assert not result.success and words in result.message, (fields, result.message)
        assert same(run(lora), serving_now)
