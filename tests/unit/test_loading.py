"""Loaded models own what is derived from them; long conversions say how far they got."""

import asyncio
import dataclasses
import gc
import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest


def test_gguf_dequantization_logs_progress(tmp_path, caplog, monkeypatch):
    import gguf

    from loaders import gguf_convert

    path = str(tmp_path / "tiny.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    tensors = {f"blk.{i}.ffn_up.weight": np.arange(12, dtype=np.float32).reshape(3, 4) * (i + 1) for i in range(4)}
    for name, value in tensors.items():
        writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    monkeypatch.setattr(gguf_convert, "PROGRESS_EVERY_S", 0.0)
    with caplog.at_level(logging.INFO, logger="mlx-backend.gguf"):
        weights = gguf_convert._dequantized_weights(path)
    assert [r.getMessage() for r in caplog.records] == [f"dequantizing tiny.gguf: {i}/4 tensors" for i in range(4)]
    for i in range(4):
        got = np.array(weights[f"model.layers.{i}.mlp.up_proj.weight"])
        assert np.array_equal(got, tensors[f"blk.{i}.ffn_up.weight"])


def _tokenizers():
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from loaders.gguf_loader import gguf_to_mlx_dir
    from loaders.model_loader import embedded_default
    from models import thinking_model_dir

    # The thinking variant gives ids 3 and 4 to "<think>" and "</think>".
    return (load_tokenizer(Path(gguf_to_mlx_dir(embedded_default()))),
            load_tokenizer(Path(thinking_model_dir())))


def test_each_model_gets_its_own_grammar_vocabulary():
    """A later model (as after Free + LoadModel) never sees an earlier model's grammar
    vocabulary: the vocabulary is kept in the model's own memo, so its key is the model
    itself and lives and dies with it. A key another object could share (an
    id() that CPython hands out again after a Free) would be a cache across models."""
    from engine.lanes import grammar
    from loaders.loaded import Memo

    plain, thinking = _tokenizers()
    assert thinking.convert_ids_to_tokens(3) == "<think>" and plain.convert_ids_to_tokens(3) != "<think>"

    def model(tok):
        return SimpleNamespace(tokenizer=tok, config={}, memo=Memo())

    first = model(plain)
    assert grammar._ll_tokenizer(first).decode_bytes([3]) != b"<think>"
    later = model(thinking)
    assert grammar._ll_tokenizer(later).decode_bytes([3]) == b"<think>", \
        "the grammar would be built with another model's vocabulary"
    for m in (first, later):  # owned by the model: nothing outside it can hand it to another
        assert "llguidance" in m.memo and m.memo.get("llguidance", None) is grammar._ll_tokenizer(m)
    assert grammar._ll_tokenizer(first).decode_bytes([3]) != b"<think>"


def test_a_loaded_model_is_a_value_that_nothing_writes_after_load():
    """What LoadModel decides after the loader (the lane, the limits, the speculation settings, a
    lockstep load id) makes a new value; the loaded one is never changed."""
    from loaders.loaded import Lane, LoadedModel

    lm = LoadedModel(name="m", source="s", model=None, tokenizer=None, config={}, context_size=8,
                     dtype="float32", options={}, load_seconds=0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        lm.lane = Lane(solo=True)
    served = dataclasses.replace(lm, lane=Lane(solo=True), load_id=3)
    assert lm.lane == Lane() and lm.load_id is None
    assert served.lane.solo and served.load_id == 3
    # The same load: requests prepared for it are served; its memo (what the weights determine) is shared.
    assert served.epoch == lm.epoch and served.memo is lm.memo


def test_a_request_prepared_for_a_replaced_model_is_aborted():
    from loaders import loaded, model_loader
    import prepare
    from common.launcher import backend_pb2
    from engine import Engine, EngineError

    first = model_loader.load(model_loader.LoadSpec(model=""))
    second = dataclasses.replace(first, epoch=next(loaded._epochs), memo=loaded.Memo())
    engine = Engine()
    try:
        engine.swap(first).result(60)
        stale = prepare.build_request(first, backend_pb2.PredictOptions(Prompt="Hello", Tokens=2))
        fresh = prepare.build_request(first, backend_pb2.PredictOptions(Prompt="Hello", Tokens=2))
        engine.swap(second).result(60)
        fresh.model_epoch = second.epoch

        async def run(request):
            return [ev async for ev in engine.stream(request)]

        with pytest.raises(EngineError) as err:
            asyncio.run(run(stale))
        assert err.value.code == "ABORTED"
        assert asyncio.run(run(fresh))[-1].tokens == 2
    finally:
        engine.stop()


def test_a_served_model_is_kept_out_of_the_collectors_walk():
    """Swapped in, the model's objects are frozen out of the garbage collector: a full
    collection walked ~460k of them (SmolLM2 and its tokenizer), ~200 ms holding the GIL."""
    from loaders import model_loader
    from engine import Engine

    model = model_loader.load(model_loader.LoadSpec(model=""))
    parts = (model.model, model.tokenizer)
    assert all(any(o is p for o in gc.get_objects()) for p in parts)  # walked until served
    engine = Engine()
    try:
        engine.swap(model).result(60)
        walked = gc.get_objects()
        assert not any(o is p for o in walked for p in parts)
    finally:
        engine.stop()
        gc.unfreeze()


def test_a_model_whose_kv_cache_cannot_be_batched_is_named_at_load():
    # Llama 4 (mlx-lm's own class, tiny): its chunked-attention layers keep a ChunkedKVCache,
    # which BatchGenerator cannot merge (the lane choice sends it to the solo lane); plain and
    # hybrid families can.
    import mlx_lm.models.llama4 as llama4
    import mlx_lm.models.lfm2 as lfm2
    import mlx_lm.models.llama as llama

    from loaders import cache_kinds

    text = dict(attention_bias=False, attention_chunk_size=8, head_dim=8, hidden_size=16,
                interleave_moe_layer_step=1, intermediate_size=16, intermediate_size_mlp=16,
                max_position_embeddings=64, model_type="llama4_text", num_attention_heads=2,
                num_experts_per_tok=1, num_hidden_layers=4, num_key_value_heads=1, num_local_experts=2,
                rms_norm_eps=1e-5, rope_scaling=None, rope_theta=10000.0, use_qk_norm=False, vocab_size=32)
    chunked = llama4.Model(llama4.ModelArgs(text_config=text, model_type="llama4"))
    assert cache_kinds.unmergeable(chunked) == "ChunkedKVCache"
    assert cache_kinds.of(chunked) == ("ChunkedKVCache", "KVCache")
    assert cache_kinds.unmergeable(llama.Model(llama.ModelArgs.from_dict(dict(
        model_type="llama", hidden_size=16, num_hidden_layers=1, intermediate_size=16, num_attention_heads=2,
        rms_norm_eps=1e-5, vocab_size=32)))) is None
    assert cache_kinds.unmergeable(lfm2.Model(lfm2.ModelArgs.from_dict(dict(
        model_type="lfm2", vocab_size=32, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, norm_eps=1e-5, conv_bias=False, conv_L_cache=3,
        block_dim=16, block_multiple_of=16, block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=False,
        block_ff_dim=16, layer_types=["conv", "full_attention"])))) is None


def test_a_vision_part_nested_in_a_wrapper_config_goes_to_the_vision_loader(tmp_path):
    # Qwen3-Omni's checkpoints keep the tower's config inside thinker_config, none at the top:
    # read only at the top, the directory went to mlx-lm, which has no such model type.
    import json

    from loaders.vision_route import is_vision

    def routed(config) -> bool:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
        return is_vision(folder)

    assert routed({"model_type": "qwen3_omni_moe", "thinker_config": {"vision_config": {"depth": 1}}})
    assert routed({"model_type": "qwen3_vl", "vision_config": {"depth": 1}})
    assert not routed({"model_type": "qwen3", "rope_scaling": {"type": "linear"}})
    assert not routed({"model_type": "qwen3_5", "text_config": {"hidden_size": 8}, "vision_config": None})


def test_the_first_probe_passes_the_smallest_sliding_window(monkeypatch):
    """The lane check's long probe (prepare/probe.py), read against the model's own caches."""
    from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache

    import prepare
    from loaders import cache_kinds, model_loader
    from prepare.probe import REACH_PAST, TEXTS, _request
    from zoo import text_builder

    plain = model_loader.load(model_loader.LoadSpec(model=""))
    short = prepare.probe_requests(plain)
    assert len(short) == len(TEXTS) and len(short[0].prompt) < 40  # no window: as written
    built = text_builder.build("mistral")
    assert built.status == "built", built.reason
    lm = model_loader.load(model_loader.LoadSpec(model=built.path))
    windows = [c.max_size for c in make_prompt_cache(lm.model) if isinstance(c, RotatingKVCache)]
    assert windows, "the zoo's mistral slides: the test needs a window"
    probes = prepare.probe_requests(lm)
    assert len(probes[0].prompt) >= min(windows) + REACH_PAST
    written = [_request(lm, text, "", None).prompt for text in TEXTS]
    assert [p.prompt for p in probes[1:]] == written[1:]  # the others as written
    for wider in (len(written[0]) + 1, 300, lm.context_size):  # past the text as written; past the context
        monkeypatch.setattr(cache_kinds, "window", lambda model, w=wider: w)
        first = prepare.probe_requests(lm)[0].prompt
        if wider + REACH_PAST < lm.context_size:
            assert wider + REACH_PAST <= len(first) < 2 * (wider + REACH_PAST), (wider, len(first))
        else:
            assert first == written[0]
