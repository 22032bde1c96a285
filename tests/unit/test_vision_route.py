"""Which library a model directory goes to, from its config.json (loaders/vision_route.py)."""

import json

import pytest

from loaders.vision_route import is_vision


@pytest.mark.parametrize("config, vision", [
    ({"model_type": "qwen2_vl", "vision_config": {"depth": 1}}, True),  # mlx-lm would drop the tower
    ({"model_type": "llama"}, False),  # mlx-vlm would load it too: mlx-lm's
    ({"model_type": "mistral"}, False),  # mlx-lm's under its own rename (onto llama)
    # mlx-vlm's Falcon OCR names no vision part in its config (pixel patches go straight into the text model)
    ({"model_type": "falcon_ocr", "spatial_patch_size": 16}, True),
    ({"model_type": "no_such_family"}, False),  # neither library's: mlx-lm's loader says so
    ({"model_type": "no-such.family"}, False),  # no module name at all
    ({"model_type": 3}, False),
    ([1, 2], False),
])
def test_a_directory_goes_to_the_library_of_its_family(tmp_path, config, vision):
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert is_vision(tmp_path) is vision


def test_no_config_or_a_broken_one_is_not_vision(tmp_path):
    assert is_vision(tmp_path) is False
    (tmp_path / "config.json").write_text("{")
    assert is_vision(tmp_path) is False
