"""Every load option in one table: its name, parser (type and allowed range) and default.

LoadModel parses `ModelOptions.Options` here, before anything loads; a bad
value is refused with the option's name and its range. What leaves is a
`Settings`: the options that were set, typed and checked, and every row's
default for the rest. Nothing downstream (loaders, the engine thread,
preparation) parses an option again.

To add an option, add one row to TABLE: `Option(name, parser, default, meaning)`.
Parsers are built by `integer`, `number`, `boolean`, `choice` and `text` below.
Pure Python, no MLX.
"""

import logging
import math
from dataclasses import dataclass, fields
from typing import Any, Callable, Dict, Iterable, Mapping, Optional

import limits
from common.python_utils import OptionError, parse_load_options

log = logging.getLogger("mlx-backend.options")

# A parser takes the value as parse_value typed it and returns it checked, or
# raises ValueError with the allowed range; `allowed` says that range for README and errors.


@dataclass(frozen=True)
class Parser:
    convert: Callable[[Any], Any]
    allowed: str


def integer(low: int, high: int) -> Parser:
    def convert(value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError
        if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
            raise ValueError
        value = int(value)
        if not low <= value <= high:
            raise ValueError
        return value

    return Parser(convert, f"a whole number in [{low}, {high}]")


def number(low: float, high: float) -> Parser:
    def convert(value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError
        value = float(value)
        if not (math.isfinite(value) and low <= value <= high):
            raise ValueError
        return value

    return Parser(convert, f"a number in [{low:g}, {high:g}]")


def boolean() -> Parser:
    def convert(value):
        if not isinstance(value, bool):
            raise ValueError
        return value

    return Parser(convert, "true or false")


def choice(*values, aliases: Optional[Dict[str, Any]] = None) -> Parser:
    """One of `values` (compared as lower-case text); `aliases` map other spellings onto them."""
    by_text = {str(v).lower(): v for v in values}
    by_text.update({k.lower(): v for k, v in (aliases or {}).items()})

    def convert(value):
        # The option parser has already typed the text: "on" came as True, "4.0" as 4.0.
        if isinstance(value, bool):
            key = "true" if value else "false"
        elif isinstance(value, float) and value.is_integer():
            key = str(int(value))
        else:
            key = str(value).strip().lower()
        if key not in by_text:
            raise ValueError
        return by_text[key]

    return Parser(convert, "one of " + ", ".join(str(v) for v in values))


def text(max_chars: int) -> Parser:
    def convert(value):
        if isinstance(value, (dict, list)) or len(str(value)) > max_chars:
            raise ValueError
        return str(value)

    return Parser(convert, f"text of at most {max_chars} characters")


def counts(most: int) -> Parser:
    """Whole numbers of at least 1, at most `most` of them, as `2,1` or `[2, 1]` (a tuple)."""
    def convert(value):
        if isinstance(value, bool):
            raise ValueError
        items = value if isinstance(value, list) else str(value).split(",")
        out = []
        for item in items:
            if isinstance(item, bool) or isinstance(item, float) and not item.is_integer():
                raise ValueError
            number = int(str(item).strip()) if not isinstance(item, (int, float)) else int(item)
            if number < 1:
                raise ValueError
            out.append(number)
        if not 1 <= len(out) <= most:
            raise ValueError
        return tuple(out)

    return Parser(convert, f"whole numbers of at least 1, comma-separated, at most {most} of them")


@dataclass(frozen=True)
class Option:
    name: str
    parser: Parser
    default: Any  # None: decided where it is used (the model's own, the device's)
    meaning: str = ""


I32 = 2**31 - 1
I64 = 2**63 - 1
BYTES = 2**50  # a petabyte: any real memory size fits

TABLE = (
    # Model and loading
    Option("context_size", integer(1, 1 << 24), None, "as ContextSize"),
    Option("dtype", choice("auto", "float32", "float16", "bfloat16", "native"), "auto", "as DType"),
    Option("trust_remote_code", boolean(), False, "as TrustRemoteCode"),
    Option("free_before_load", boolean(), False, "free the current model before loading this one"),
    Option("kv_bits", choice(0, 2, 3, 4, 5, 6, 8), 0, "quantized KV cache bits (0: off)"),
    Option("kv_group_size", choice(32, 64, 128), 64, "quantized KV cache group size"),
    Option("fast_gelu", boolean(), True, "tanh GELU in encoders on the CPU"),
    Option("lane", choice("auto", "batch", "solo"), "auto",
           "which lane generates (auto: by the model's caches and a check at load)"),
    # Across ranks (docs/multi-host.md)
    Option("parallel", choice("auto", "tensor", "pipeline"), "auto",
           "how a group of ranks divides the model (auto: tensor on one machine where it divides, else pipeline)"),
    Option("pipeline_split", counts(1024), None,
           "layers per rank in pipeline mode, rank 0 first (rank 0 holds the last layers; default: even)"),
    # Scheduling and memory
    Option("max_sequences", integer(1, 1024), 64, "sequences decoded together, at most (the KV budget binds first)"),
    Option("prefill_step_size", integer(0, 1 << 16), 0, "prompt tokens per prefill chunk (0: by device)"),
    Option("prefill_batch_size", integer(1, 1024), 8, "prompts prefilled together"),
    Option("prefill_step_tokens", integer(0, 1 << 20), 0,
           "prompt tokens prefilled per decode step, new requests together (0: by device)"),
    Option("prompt_cache_bytes", integer(0, BYTES), None, "byte bound of the prefix KV cache"),
    Option("prompt_cache_entries", integer(1, 1 << 20), 64, "entry bound of the prefix KV cache"),
    Option("prompt_cache_disk_bytes", integer(0, BYTES), None, "byte bound of the prefix cache's disk tier (0: off)"),
    Option("forward_chunk_tokens", integer(1, 1 << 20), None, "tokens per embedding / score pass"),
    Option("max_concurrent_rpcs", integer(1, 1 << 16), 256, "RPCs doing work at once"),
    Option("max_waiting", integer(0, 1 << 16), 128, "requests waiting for a place in the batch"),
    Option("kv_budget_bytes", integer(0, BYTES), None, "KV bytes running requests may reserve (0: no bound)"),
    Option("health_timeout", number(0.05, 86400), 60.0, "seconds of failing or stuck engine before Health fails"),
    # Request defaults
    Option("temperature", number(0, 1e4), 0.0, "default for requests"),
    Option("top_p", number(0, 1), 1.0, "default for requests"),
    Option("top_k", integer(0, I32), 0, "default for requests"),
    Option("min_p", number(0, 1), 0.0, "default for requests"),
    Option("repetition_penalty", number(0, 1e4), 0.0, "default for requests"),
    Option("repetition_context_size", integer(1, 1 << 20), 20, "tokens the repetition penalty looks back at"),
    Option("presence_penalty", number(-1e4, 1e4), 0.0, "default for requests"),
    Option("frequency_penalty", number(-1e4, 1e4), 0.0, "default for requests"),
    Option("xtc_probability", number(0, 1), 0.0, "XTC sampling probability"),
    Option("xtc_threshold", number(0, 0.5), 0.1, "XTC sampling threshold"),
    Option("seed", integer(-I64 - 1, I64), 0, "default for requests"),
    Option("max_tokens", integer(0, I32), 0, "default for requests (0: to the context's end)"),
    Option("enable_thinking", boolean(), None, "default for the chat template's thinking switch"),
    # Speculative decoding
    Option("speculation", choice("off", "lookup", "draft", "auto",
                                 aliases={"false": "off", "none": "off", "0": "off", "true": "auto"}),
           None, "speculative decoding (default, or auto/on: draft with DraftModel, else lookup)"),
    Option("n_draft", integer(1, 32), None, "tokens proposed per step"),
    Option("ngram_size", integer(1, 64), 3, "longest n-gram prompt lookup matches"),
    Option("ngram_min", integer(1, 64), 1, "shortest n-gram prompt lookup matches"),
    # Embedding, Score, Rerank
    Option("embedding_pooling", choice("mean", "cls", "last", "none"), None, "pooling (default: the model's)"),
    Option("embedding_normalize", boolean(), None, "L2-normalise embeddings (default: the model's)"),
    Option("max_candidates", integer(1, 1 << 16), 256, "candidates per Score call"),
    Option("max_documents", integer(1, 1 << 16), 256, "documents per Rerank call"),
    Option("rerank_instruct", text(4096), None, "the instruction of a causal LM's rerank prompt"),
    # Vision
    Option("video_fps", number(0.01, 240), None, "frames sampled per second of video"),
    Option("max_video_frames", integer(2, 1 << 12), None, "frames sampled per video"),
    Option("max_image_pixels", integer(1, 1 << 34), 4096 * 4096, "pixels of one image or video frame"),
    Option("max_images", integer(0, 1 << 16), 16, "images per request (LimitImagePerPrompt wins when set)"),
    Option("max_videos", integer(0, 1 << 12), 4, "videos per request (LimitVideoPerPrompt wins when set)"),
    Option("max_audios", integer(0, 1 << 12), 4, "audio items per request (LimitAudioPerPrompt wins when set)"),
    Option("max_media_bytes", integer(1, 1 << 30), 32 << 20, "decoded bytes of a request's media"),
    Option("max_request_pixels", integer(1, 1 << 40), 1 << 27, "pixels a whole request decodes"),
    # Audio (speech to text, text to speech, voice activity)
    Option("audio_max_bytes", integer(1, 1 << 40), 1 << 30, "bytes of an audio file to transcribe"),
    Option("audio_max_seconds", number(0.01, 1e6), 7200.0, "seconds of an audio file to transcribe"),
    Option("tts_max_chars", integer(1, 1 << 24), 20000, "characters of a text to speak"),
    Option("vad_max_seconds", number(0.01, 1e6), 3600.0, "seconds of samples one VAD call takes"),
    Option("vad_sample_rate", integer(1000, 384000), 16000, "the sample rate of VAD samples (the request says none)"),
    Option("voice", text(256), None, "the voice a TTS request without one speaks in (default: the model's)"),
    Option("language", text(64), None, "the language of a TTS or transcription request that names none"),
    Option("speed", number(0.1, 10), 1.0, "TTS speaking speed"),
)
# The per-request text bounds (limits.py holds their defaults and ranges).
TABLE += tuple(
    Option(f.name, (number if f.type in (float, "float") else integer)(*limits.RANGES[f.name]), f.default,
           "per-request text bound (docs/bounds.md)")
    for f in fields(limits.TextLimits))
ROWS: Dict[str, Option] = {row.name: row for row in TABLE}


class Settings(dict):
    """The options that were set (typed, checked); attributes give every row's value or default.

    A dict, so code reading `name in settings` ("was it set?") and the lockstep
    journal (which sends it as JSON) keep working.
    """

    def __getattr__(self, name: str) -> Any:
        if name in self:
            return self[name]
        row = ROWS.get(name)
        if row is None:
            raise AttributeError(f"no load option {name!r}")
        return row.default


def check(name: str, value: Any, label: str = "") -> Any:
    """`value` for option `name`, typed and in range; OptionError naming it (or `label`,
    a ModelOptions field the option stands for) and its range otherwise."""
    row = ROWS[name]
    try:
        return row.parser.convert(value)
    except (ValueError, TypeError, OverflowError):
        raise OptionError(f"{label or 'option ' + name}: expected {row.parser.allowed}, got {_show(value)}") from None


def _show(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def settings(options: Mapping[str, Any]) -> Settings:
    """Options as parse_load_options typed them, checked against the table.

    Options this backend does not know are logged and ignored: a host sends one
    model's options to whichever backend serves it.
    """
    if isinstance(options, Settings):
        return options
    out = Settings()
    for name, value in options.items():
        if name in ROWS:
            out[name] = check(name, value)
        else:
            log.warning("option %s is not known to this backend: ignored", name)
    return out


def parse(entries: Iterable[str]) -> Settings:
    """ModelOptions.Options (`key:value` strings) into Settings; OptionError names the bad one."""
    return settings(parse_load_options(entries))
