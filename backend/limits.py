"""Per-request text budgets: their defaults, the load options that change them, their ranges.

Read and range-checked once, in LoadModel (a bad value fails the load naming the
option); the preparation thread only compares a request against them. Each bound
is checked at the cheapest point before the work it protects.
"""

from dataclasses import dataclass, fields
from typing import Any, Dict

from common.python_utils import OptionError, option_float, option_int

MIB = 1024 * 1024


@dataclass(frozen=True)
class TextLimits:
    max_messages: int = 4096  # Messages per request
    max_prompt_bytes: int = 8 * MIB  # Prompt + Messages + Tools + Metadata, before rendering
    max_stop_strings: int = 32  # StopPrompts per request (matched every token on the engine thread)
    max_stop_bytes: int = 512  # bytes of one stop string (the matcher holds back up to this)
    max_stop_total_bytes: int = 4096  # bytes of all stop strings together
    max_json_depth: int = 64  # nesting of any JSON field (Tools, Metadata JSON, tool_calls)
    template_seconds: float = 10.0  # one chat-template render (the prep thread it holds)
    template_output_bytes: int = 16 * MIB  # text one chat-template render may produce
    max_detokenize_tokens: int = 1 << 20  # ids in one Detokenize


# option name -> (field, lowest, highest): the option names are the field names.
RANGES = {
    "max_messages": (1, 1_000_000),
    "max_prompt_bytes": (1, 64 * MIB),
    "max_stop_strings": (0, 1024),
    "max_stop_bytes": (1, 64 * 1024),
    "max_stop_total_bytes": (1, 1 * MIB),
    "max_json_depth": (2, 512),  # below Python's recursion limit, so parsing never recurses out
    "template_seconds": (0.01, 600.0),
    "template_output_bytes": (1024, 256 * MIB),
    "max_detokenize_tokens": (1, 64 * MIB),
}


def from_options(options: Dict[str, Any]) -> TextLimits:
    """The limits a load's Options ask for; OptionError names the option and its range."""
    values = {}
    for f in fields(TextLimits):
        low, high = RANGES[f.name]
        if f.type is float or f.type == "float":
            value = option_float(options, f.name, f.default, low, high)
        else:
            value = option_int(options, f.name, f.default, minimum=low)
            if value > high:
                raise OptionError(f"option {f.name}: must be within [{low}, {high}], got {value}")
        values[f.name] = value
    return TextLimits(**values)


def of(lm) -> TextLimits:
    """The limits a model was loaded with (LoadedModel.text_limits; the defaults for one built
    without LoadModel)."""
    return getattr(lm, "text_limits", None) or TextLimits()
