"""LoadModel's LoRA and KV-cache fields, checked before loading (pure)."""

import math

import pytest
from hypothesis import given, strategies as st

from loaders.adapt_options import KVSpec, kv_spec, lora_requests
from common.python_utils import OptionError
from load_options import settings

# The host's spellings and what each stores per value (hand table).
TYPES = {"": None, "f32": 32, "f16": 16, "bf16": 16, "q8_0": 8, "q6_k": 6, "q5_0": 5, "q5_1": 5,
         "q4_0": 4, "q4_1": 4}
NAMES = st.sampled_from(sorted(TYPES))


def bits_of(spec) -> int:
    return 32 if spec is None else spec.bits or {"float16": 16, "bfloat16": 16}[spec.dtype]


@given(NAMES, NAMES, st.booleans())
def test_the_more_precise_cache_type_serves_keys_and_values(key, value, upper):
    spec = kv_spec(key.upper() if upper else key, value, settings({}))
    widths = [TYPES[t] for t in (key, value) if t]
    assert bits_of(spec) == (max(widths) if widths else 32)
    if spec is not None and spec.bits:
        assert spec.group_size == 64


@given(st.sampled_from([2, 3, 4, 5, 6, 8]), st.sampled_from([32, 64, 128]), NAMES)
def test_the_kv_bits_option_wins(bits, group, name):
    options = settings({"kv_bits": bits, "kv_group_size": group})
    assert kv_spec(name, name, options) == KVSpec(bits=bits, group_size=group)


@pytest.mark.parametrize("key,value,options,words", [
    ("q3_x", "", {}, "CacheTypeKey"),
    ("", "int8", {}, "CacheTypeValue"),
    ("", "", {"kv_bits": 7}, "kv_bits"),
    ("q8_0", "", {"kv_group_size": 48}, "kv_group_size"),
    ("", "", {"kv_bits": "eight"}, "kv_bits"),
])
def test_bad_cache_options_are_refused_by_name(key, value, options, words):
    with pytest.raises(OptionError, match=words):
        kv_spec(key, value, settings(options))


PATHS = st.text(st.characters(min_codepoint=ord("a"), max_codepoint=ord("z")), min_size=1, max_size=6)


@given(st.lists(PATHS, max_size=4), st.data())
def test_each_adapter_gets_its_scale_or_one(paths, data):
    scales = data.draw(st.lists(st.floats(-4, 4), max_size=len(paths)))
    single = data.draw(st.one_of(st.just(""), PATHS))
    single_scale = data.draw(st.floats(-4, 4))
    got = lora_requests(single, single_scale, paths, scales)
    want = ([(single, single_scale or 1.0)] if single else []) + [
        (p, scales[i] if i < len(scales) else 1.0) for i, p in enumerate(paths)]
    assert got == want


@pytest.mark.parametrize("paths,scales,words", [
    (["a"], [1.0, 2.0], "LoraScales"),
    (["a", " "], [], r"LoraAdapters\[1\]"),
    (["a"], [math.nan], "finite"),
])
def test_bad_adapter_lists_are_refused(paths, scales, words):
    with pytest.raises(OptionError, match=words):
        lora_requests("", 0.0, paths, scales)
