"""End-to-end: what a group of ranks serves beside a plain model: LoRA adapters (fused on each
rank's slice, or added beside a quantized layer each pipeline stage keeps whole), and what it
refuses by name (an added adapter under tensor parallelism, a quantized KV cache, a vision model).

A tiny qwen2 (mlx-lm divides it both ways) and random adapters in mlx-lm's format
(lora_models.py); the oracle for "base + adapter" is the model with the adapter added into its
weights in numpy, loaded as a plain model by the same group, and the same load in one process.
"""

import pytest

from common.launcher import Backend
from dist_support import RankGroup
from lora_models import build_folder, run, same

pytestmark = pytest.mark.e2e

ENV = {"MLX_BACKEND_RANK_TIMEOUT": "20"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_folder(tmp_path_factory.mktemp("group-lora"), family="qwen2")


@pytest.fixture(scope="module")
def group(folder, log_dir):
    g = RankGroup(2, log_dir, env=ENV, log_name="group-adapt")
    try:
        g.wait_healthy(180)
        yield g
    finally:
        g.stop()


@pytest.fixture(scope="module")
def single(log_dir):
    with Backend(log_path=str(log_dir / "group-adapt-single.log")) as backend:
        backend.wait_healthy(120)
        yield backend


def served(backend, folder, model, mode=None, **fields):
    options = [f"parallel:{mode}"] if mode else []
    result = backend.load(model, ModelPath=str(folder), Options=options, **fields)
    assert result.success, result.message
    return run(backend)


@pytest.mark.parametrize("mode", ["tensor", "pipeline"])
def test_an_adapter_fused_on_each_ranks_part_is_the_fused_model(group, single, folder, mode):
    plain = served(group, folder, "base", mode)
    want = served(group, folder, "fused1", mode)
    assert [ids for ids, _ in want] != [ids for ids, _ in plain]  # the adapter changes the text
    got = served(group, folder, "base", mode, LoraAdapter="ad1", LoraScale=1.5)
    assert same(got, want)
    assert same(got, served(single, folder, "base", LoraAdapter="ad1", LoraScale=1.5))


def test_an_adapter_beside_a_quantized_layer_in_a_pipeline(group, single, folder):
    # DType native keeps the 4-bit weights (on this CPU `auto` casts them to float32 and fuses).
    got = served(group, folder, "qbase", "pipeline", DType="native", LoraAdapter="ad1")
    assert same(got, served(single, folder, "qbase", DType="native", LoraAdapter="ad1"))  # the same LoRAStack
    assert same(got, served(single, folder, "qfused1"))  # and the dequantized weights with it added


def test_what_a_group_cannot_divide_is_refused_by_name_and_the_old_model_serves(group, folder):
    from vision_fixture import tiny_qwen2_vl

    before = served(group, folder, "base", "pipeline")
    for model, fields, words in (
            ("qbase", dict(DType="native", LoraAdapter="ad1", Options=["parallel:tensor"]),
             "tensor parallelism splits itself"),
            ("base", dict(CacheTypeKey="q8_0", CacheTypeValue="q8_0"), "KV cache types are not served across ranks"),
            (tiny_qwen2_vl(), {}, "vision models are not served across ranks")):
        result = group.load(model, ModelPath=str(folder), **fields)
        assert not result.success and words in result.message, result.message
    assert same(run(group), before)
