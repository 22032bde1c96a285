"""Recipes: families whose checkpoints hold packed weights the builder makes from seeded dense ones."""

from zoo.recipes.base import QWEN, Recipe, _MROPE_PARTIAL, _add, _qwen3, _qwen_preprocessor


# ---- Prism Hadamard Qwen 3.5 (prism_hadamard_qwen35): Qwen 3.5 whose config lists packed modules (a manifest:
# path, kind, activation dtype, rotation block) and refuses any quantization but 2-bit affine in groups of 128. A
# listed linear multiplies its input, rotated by a signed blockwise Walsh-Hadamard transform when its block is set
# (512 to 4096, dividing the input width), by 2-bit packed weights; the rest of the model stays as stored. Here the
# MLP's down projection of both layers (input width 512, the intermediate size): one rotated in blocks of 512, one
# not. The packed placeholders its code allocates are zeros, so the builder quantizes seeded dense matrices into
# them (`packed`).

_PACKED = [{"path": "model.layers.0.mlp.down_proj", "embedding": False, "dtype": "float16", "block": 512},
           {"path": "model.layers.1.mlp.down_proj", "embedding": False, "dtype": "float16", "block": 0}]


def _prism(m, ids, vocab):
    config = _qwen3("prism_hadamard_qwen35", {"rope_parameters": _MROPE_PARTIAL, "intermediate_size": 512}, {},
                    base="qwen3_5")(m, ids, vocab)
    return {**config, "schema_version": 2, "base_model_type": "qwen3_5", "tensor_namespace": "mlx-vlm-qwen3_5",
            "gdn_activation_layout": "grouped", "modules": _PACKED,
            "quantization": {"bits": 2, "group_size": 128, "mode": "affine"}}


def hadamard_packs(weights: dict, config: dict) -> dict:
    """Each listed module's packed weight, scales and biases: a seeded dense matrix of its shape
    quantized as the family's loader expects (2 bits, groups of 128, float16 scales), and a
    random sign vector for a rotated one."""
    import mlx.core as mx

    for record in config["modules"]:
        name = f"language_model.{record['path']}"
        rows, words = weights[f"{name}.weight"].shape
        width = words * 16  # sixteen 2-bit values a 32-bit word
        dense = (mx.random.normal((rows, width)) * width ** -0.5).astype(mx.float16)
        weights[f"{name}.weight"], weights[f"{name}.scales"], weights[f"{name}.biases"] = mx.quantize(
            dense, group_size=128, bits=2)
        if record["block"]:
            weights[f"{name}.signs"] = mx.where(mx.random.bernoulli(shape=(width,)), 1.0, -1.0)
    return weights


# The MLP's input projections into those 512 channels are left at their initial scale: scaled up, the MLP drowns
# the image (both pictures gave the same text).
_add("prism_hadamard_qwen35", Recipe(**QWEN, config=_prism, packed=hadamard_packs,
                                     scaled={"mlp.gate_proj": 1.0, "mlp.up_proj": 1.0},
                                     files={"preprocessor_config.json": _qwen_preprocessor(16)}))
