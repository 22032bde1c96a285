"""The family matrices' results file and the doc page written from it (tests/zoo/)."""

import json

import pytest

from zoo import families_doc, text_families
from zoo.results import Results, entry


def _results():
    return {"library": "mlx-lm 0.32.2", "families": {
        "llama": entry("served", lane="batch", cache_kinds=["KVCache"], alone=True, batched=True, stream=True,
                       prefix=True, speculation=True, score=True),
        "mamba": entry("served", "batched: C: 'x' != library 'y'", lane="batch", cache_kinds=["ArraysCache"],
                       alone=True, batched=False, stream=True, prefix=True, speculation=True, score=True),
        "llama4": entry("refused", "cannot be batched | by mlx-lm's BatchGenerator", cache_kinds=["ChunkedKVCache"]),
        "olmo": entry("library-cannot", "To run olmo install ai2-olmo"),
        "prism": entry("not-built", "no tiny config"),
        "phi3small": entry("library-cannot", "crashes in /usr/lib/python3/site-packages/mlx/core.so here"),
    }}


def test_every_family_is_in_the_doc_served_ones_in_the_table_the_others_with_their_reason():
    page = families_doc.render(_results())
    assert "| `llama` | batch | KVCache | yes | yes | yes | yes | yes | yes |" in page
    assert "| `mamba` | batch | ArraysCache | yes | **no** | yes | yes | yes | yes |" in page
    assert "- `mamba` (served, not exact): batched: C: 'x' != library 'y'" in page
    # A reason's "|" would break the table the list sits under in a Markdown viewer.
    assert "- `llama4` (refused): cannot be batched / by mlx-lm's BatchGenerator" in page
    assert "- `olmo` (library-cannot): To run olmo install ai2-olmo" in page
    assert "- `prism` (not-built): no tiny config" in page
    assert "- `phi3small` (library-cannot): crashes in <path> here" in page
    assert "`llama` (" not in page  # exact: in the table only
    assert ("6 families: 1 served exactly, 1 served, not exact, 1 refused, 2 library-cannot, 1 not-built "
            "(2 in the batch lane).") in page
    assert families_doc.VISION_UNMATRIXED in page and "Vision families (" not in page  # no vision table


def test_the_vision_section_comes_with_vision_results():
    vision = {"library": "mlx-vlm 0.7.10", "families": {
        "qwen2_vl": entry("served", lane="batch", cache_kinds=["KVCache"], alone=True, batched=True, images=True,
                          video=None)}}
    page = families_doc.render(_results(), vision)
    assert "## Vision families (mlx-vlm 0.7.10)" in page
    assert "| `qwen2_vl` | batch | KVCache | yes | yes | – | – | yes | – |" in page


def test_results_are_rewritten_whole_after_each_family(tmp_path):
    results = Results(tmp_path / "text.json", "mlx-lm 0.32.2")
    results.record("llama", entry("served", alone=True))
    results.record("olmo", entry("library-cannot", "a package"))
    data = json.loads((tmp_path / "text.json").read_text())
    assert set(data["families"]) == {"llama", "olmo"}
    assert data["families"]["llama"]["checks"] == {c: (True if c == "alone" else None) for c in
                                                   data["families"]["llama"]["checks"]}
    assert list(tmp_path.iterdir()) == [tmp_path / "text.json"]


def test_an_entry_refuses_what_the_schema_does_not_have():
    with pytest.raises(ValueError):
        entry("exact")
    with pytest.raises(ValueError):
        entry("served", pictures=True)


def test_the_family_set_is_what_mlx_lm_ships_remapped_names_included():
    families = text_families.families()
    assert {"llama", "qwen3", "mamba", "llama4"} <= set(families)
    assert {"mistral", "falcon_mamba", "qwen2_5_vl"} <= set(families)  # MODEL_REMAPPING's names
    assert text_families.module_of("mistral") == "llama"
    assert not {"cache", "base", "rope_utils", "switch_layers"} & set(families)  # helpers, no Model


def test_a_run_of_some_vision_families_updates_them_in_an_earlier_runs_file(tmp_path, monkeypatch):
    """FAMILIES=... into the folder of a whole run: that run's other families stay, those run
    again are replaced; a file of another mlx-vlm is not mixed in."""
    import mlx_vlm

    from zoo.vision_results import Results as VisionResults

    path = tmp_path / "vision.json"
    whole = VisionResults(str(path))
    whole.family("qwen2_vl").check("alone", True)
    whole.family("phi3_v").not_built("a tower too big")
    whole.write()
    again = VisionResults(str(path))
    again.family("phi3_v").check("alone", False)
    again.write()
    families = json.loads(path.read_text())["families"]
    assert families["qwen2_vl"]["checks"]["alone"] is True
    assert families["phi3_v"]["status"] == "served" and families["phi3_v"]["checks"]["alone"] is False

    monkeypatch.setattr(mlx_vlm, "__version__", "0.0.0-other")
    other = VisionResults(str(path))
    other.family("smolvlm").check("alone", True)
    other.write()
    assert set(json.loads(path.read_text())["families"]) == {"smolvlm"}


def test_a_full_size_tower_family_is_built_only_when_asked(monkeypatch):
    from zoo import vision_families

    monkeypatch.delenv("ZOO_FULL_TOWERS", raising=False)
    heavy = sorted(vision_families.FULL_TOWERS)[0]
    assert not vision_families.built_here(heavy, [])
    assert vision_families.built_here(heavy, [heavy])
    assert vision_families.built_here("qwen2_vl", [])
    assert not vision_families.built_here("siglip", [])  # no recipe: never
    assert vision_families.reason(heavy) == vision_families.FULL_TOWERS[heavy]
    monkeypatch.setenv("ZOO_FULL_TOWERS", "1")
    assert vision_families.built_here(heavy, [])


def test_the_audio_section_lists_each_family_and_is_spliced_alone():
    audio = {"library": "mlx-audio 0.6.2", "families": {
        "whisper": {"kind": "stt", "status": "served", "reason": "", "checks": {"alone": True, "together": True,
                                                                                "stream": True}},
        "kokoro": {"kind": "tts", "status": "differs", "reason": "stream differs",
                   "checks": {"alone": True, "together": True, "stream": False}},
        "sesame": {"kind": "tts", "status": "not-built", "reason": "its codec comes from the hub", "checks": {}}}}
    page = families_doc.render(_results(), audio=audio)
    section = page[page.index("## Audio families (mlx-audio 0.6.2)"):page.index("## Refused families")]
    assert "| `whisper` | stt | yes | yes | yes |" in section and "| `kokoro` | tts | yes | yes | **no** |" in section
    assert "- `sesame` (not-built): its codec comes from the hub" in section
    assert "- `kokoro` (served, not exact): stream differs" in section
    spliced = families_doc.splice_audio(families_doc.render(_results()), audio)
    assert spliced.count("\n## Audio families (") == 1 and section in spliced
    assert families_doc.splice_audio(spliced, audio) == spliced  # in place the second time
