"""End to end: LoRA adapters applied at LoadModel, through the real server.

A tiny random llama (SmolLM2's tokenizer) and random adapters in mlx-lm's
directory format (lora_models.py); the oracle for "base + adapters" is a
model directory whose weights had the adapters added in numpy
(W + scale * (A @ B)^T, in float64), loaded as a plain model.
"""

import pytest

from conftest import serving
from lora_models import build_folder, run, same

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The models folder: base (float), qbase (4-bit), adapters, and the fused oracles."""
    return build_folder(tmp_path_factory.mktemp("lora_models"))


@pytest.fixture(scope="module")
def lora(folder, log_dir):
    yield from serving(log_dir / "lora.log", "base", ModelPath=str(folder))


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
