"""The load-option table: every value typed and range-checked in LoadModel (pure)."""

import logging
import math

import pytest
from hypothesis import given, strategies as st

from common.python_utils import OptionError
from load_options import ROWS, TABLE, parse

# Hand table of some rows' ranges, as docs/load-options.md states them (not read from the code).
INTEGER_RANGES = {
    "forward_chunk_tokens": (1, 1 << 20),
    "max_sequences": (1, 1024),
    "prefill_step_size": (0, 1 << 16),
    "context_size": (1, 1 << 24),
    "max_waiting": (0, 1 << 16),
    "max_concurrent_rpcs": (1, 1 << 16),
    "n_draft": (1, 32),
}
NUMBER_RANGES = {"top_p": (0.0, 1.0), "min_p": (0.0, 1.0), "xtc_threshold": (0.0, 0.5),
                 "health_timeout": (0.05, 86400.0)}


@pytest.mark.parametrize("value", ["0", "-5", "abc", "1.5", "1e400", "9" * 5000, "true", "[1]", ""])
def test_a_bad_forward_chunk_is_refused_with_its_name_and_range(value):
    with pytest.raises(OptionError) as e:
        parse([f"forward_chunk_tokens:{value}"])
    assert "forward_chunk_tokens" in str(e.value) and "[1, 1048576]" in str(e.value)


@given(st.sampled_from(sorted(INTEGER_RANGES)), st.integers(-(1 << 40), 1 << 40), st.booleans())
def test_whole_numbers_are_kept_exactly_when_in_range(name, n, as_float):
    low, high = INTEGER_RANGES[name]
    text = f"{float(n)!r}" if as_float else str(n)
    if low <= n <= high:
        assert getattr(parse([f"{name}:{text}"]), name) == n
    else:
        with pytest.raises(OptionError, match=name):
            parse([f"{name}:{text}"])


@given(st.sampled_from(sorted(NUMBER_RANGES)), st.floats(allow_nan=True, allow_infinity=True))
def test_numbers_are_kept_when_finite_and_in_range(name, x):
    low, high = NUMBER_RANGES[name]
    if math.isfinite(x) and low <= x <= high:
        assert parse([f"{name}:{x!r}"])[name] == x
    else:
        with pytest.raises(OptionError, match=name):
            parse([f"{name}:{x!r}"])


@given(st.sampled_from([row.name for row in TABLE]), st.text(max_size=40))
def test_any_text_for_any_option_is_typed_or_refused_by_name(name, value):
    try:
        got = parse([f"{name}:{value}"])
    except OptionError as e:
        assert name in str(e) and "expected" in str(e)
        return
    assert set(got) == {name}
    default = ROWS[name].default
    if default is not None and not isinstance(default, str):  # the type of its default
        assert isinstance(got[name], type(default)) or (type(default) is float and type(got[name]) is float)


def test_unset_options_give_their_defaults_and_unknown_ones_are_ignored(caplog):
    with caplog.at_level(logging.WARNING):
        got = parse(["max_sequences:4", "gpu_layers:99", "Speculation:FALSE", "KV-Bits:4"])
    assert dict(got) == {"max_sequences": 4, "speculation": "off", "kv_bits": 4}
    assert "gpu_layers" in caplog.text
    assert got.max_sequences == 4 and got.prefill_batch_size == 8 and got.forward_chunk_tokens is None
    assert got.health_timeout == 60.0 and got.max_waiting == 128
    with pytest.raises(AttributeError):
        got.no_such_option  # noqa: B018


@pytest.mark.parametrize("entry,words", [
    ("kv_bits:7", "kv_bits: expected one of 0, 2, 3, 4, 5, 6, 8"),
    ("kv_group_size:48", "one of 32, 64, 128"),
    ("dtype:int8", "one of auto, float32"),
    ("enable_thinking:maybe", "true or false"),
    ("embedding_pooling:max", "embedding_pooling"),
    ("speculation:sometimes", "speculation"),
])
def test_choices_name_what_is_allowed(entry, words):
    with pytest.raises(OptionError, match=words):
        parse([entry])


# How people write these values in a model YAML, and what each means (hand table).
@pytest.mark.parametrize("entry,name,meant", [
    ("kv_bits:4", "kv_bits", 4),
    ("kv_bits:4.0", "kv_bits", 4),
    ("kv_group_size:64.0", "kv_group_size", 64),
    ("speculation:on", "speculation", "auto"),
    ("speculation:true", "speculation", "auto"),
    ("speculation:yes", "speculation", "auto"),
    ("speculation:off", "speculation", "off"),
    ("speculation:false", "speculation", "off"),
    ("speculation:0", "speculation", "off"),
    ("speculation:Lookup", "speculation", "lookup"),
])
def test_choice_values_are_read_as_people_write_them(entry, name, meant):
    assert parse([entry])[name] == meant


@pytest.mark.parametrize("entry", ["kv_bits:4.5", "kv_bits:on", "speculation:2"])
def test_near_misses_of_a_choice_are_still_refused(entry):
    with pytest.raises(OptionError):
        parse([entry])


@pytest.mark.parametrize("written,draft_model,mode", [
    ("speculation:on", "", "lookup"), ("speculation:on", "draft-dir", "draft"), (None, "", "lookup"),
    ("speculation:off", "draft-dir", "off"),
])
def test_speculation_on_means_the_default_kind(written, draft_model, mode):
    from engine.speculation import spec_config

    assert spec_config.parse(parse([written] if written else []), draft_model).mode == mode
