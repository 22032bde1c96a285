"""What every loader builds and hands the engine: the loaded model and its load request.

A LoadedModel is a value: a loader builds it whole, and what LoadModel decides after the load
(the speculation settings, the text limits, the lane, a lockstep load id) makes a new one
(dataclasses.replace) before the engine is given it; nothing writes to one afterwards.

Kept apart from the loaders themselves so that each loader (mlx-lm and GGUF in
model_loader, mlx-vlm in vision_model, the encoders in embed_loader and
cross_encoder) imports these from here while model_loader imports the loaders
to route between them: no loader imports another to build its result.
"""

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import limits
import load_options

_epochs = itertools.count(1)


class ModelNotFound(Exception):
    """The model named by the host is nowhere to be found."""


class ModelLoadError(Exception):
    """The model exists but cannot be served; the message says why."""


@dataclass
class LoadSpec:
    model: str
    model_file: str = ""
    model_path: str = ""
    options: Any = field(default_factory=dict)  # load_options.Settings once built
    context_size: int = 0
    dtype: str = "auto"
    trust_remote_code: bool = False
    adapters: List[Tuple[str, float]] = field(default_factory=list)  # LoRA (directory, scale)
    kv: Any = None  # adapt_options.KVSpec, None: the model's own float cache
    media: Any = None  # media_bounds.MediaBounds of a vision model (None: the defaults)

    def __post_init__(self):
        # Typed and checked once (load_options); a plain dict (a follower's copy, a draft's spec) too.
        self.options = load_options.settings(self.options)


@dataclass(frozen=True)
class Serves:
    """What a loaded model serves: the servicer asks this, never which library or kind serves it."""
    what: str  # how refusals name the model: "a causal language model", "an embedding model", ...
    generate: bool  # Predict, PredictStream (and a chat template for TokenizeString)
    embed: bool  # Embedding
    score: bool  # Score
    rerank: bool  # Rerank
    media: Tuple[str, ...] = ()  # what a Predict may carry besides text: "image", "video"
    audio: Tuple[str, ...] = ()  # the audio RPCs it serves: "transcribe", "speak", "detect"
    # How its forward passes run (engine/forward/passes.py asks these, never the kind):
    # a causal LM's: a chunk is its prefill chunk, a long input is embedded a chunk at a time
    # continuing its KV cache, and a score shares its batch's prefix cache;
    causal_forward: bool = False
    # an encoder's: inputs padded with its pad token under an attention mask, the last hidden state pooled.
    encoder_forward: bool = False


# By the loader that built the model (LoadedModel.kind); only loaders set a kind.
SERVES = {
    "text": Serves("a causal language model", generate=True, embed=True, score=True, rerank=True,
                   causal_forward=True),
    "vision": Serves("a vision model", generate=True, embed=False, score=False, rerank=False,
                     media=("image", "video")),
    "embedding": Serves("an embedding model", generate=False, embed=True, score=False, rerank=True,
                        encoder_forward=True),
    "reranker": Serves("a cross-encoder reranker", generate=False, embed=False, score=False, rerank=True),
    # mlx-audio's kinds (audio_model.py), named as refusals name them.
    "speech-to-text": Serves("a speech-to-text model", generate=False, embed=False, score=False, rerank=False,
                             audio=("transcribe",)),
    "text-to-speech": Serves("a text-to-speech model", generate=False, embed=False, score=False, rerank=False,
                             audio=("speak",)),
    "voice-activity": Serves("a voice-activity model", generate=False, embed=False, score=False, rerank=False,
                             audio=("detect",)),
}


@dataclass(frozen=True)
class Lane:
    """Which lane generates for a loaded model (engine/lane_choice.py decides it at load)."""
    solo: bool = False  # one request at a time through the library's own step; else the batch
    prefill_alone: bool = False  # in the batch, each prompt prefilled on its own, then merged to decode
    reason: str = ""  # why, for the log

    @property
    def name(self) -> str:
        return "solo" if self.solo else "batch, each prompt prefilled alone" if self.prefill_alone else "batch"


class Memo:
    """What a loaded model's own parts determine, computed on first use and kept with it (the
    llguidance tokenizer, the split check): a cache, never a decision or a setting, so it is the
    one thing held by a LoadedModel that fills after load. Kept in the model, not keyed by it
    elsewhere: a later model can never get an earlier one's (docs/testing.md). A value made from
    another by dataclasses.replace shares it: the same weights and tokenizer give the same."""

    def __init__(self):
        self._values: Dict[str, Any] = {}

    def get(self, key: str, compute: Callable[[], Any]) -> Any:
        """The value under `key`, computed by `compute` the first time (callers that may race
        on a costly one hold their own lock around this)."""
        if key not in self._values:
            self._values[key] = compute()
        return self._values[key]

    def __contains__(self, key: str) -> bool:
        return key in self._values


# eq=False: two values are equal only as the same object (comparing weights field by field means nothing).
@dataclass(frozen=True, eq=False)
class LoadedModel:
    name: str
    source: str
    model: Any
    tokenizer: Any
    config: Dict[str, Any]
    context_size: int
    dtype: str
    options: Any  # load_options.Settings
    load_seconds: float
    # Which load this is: a request prepared for another epoch is refused.
    epoch: int = field(default_factory=lambda: next(_epochs))
    adapters: Tuple[str, ...] = ()  # LoRA directories applied
    adapter_scales: Tuple[float, ...] = ()  # their scales, in order
    kv: Any = None  # adapt_options.KVSpec of its KV cache
    kv_bytes_per_token: int = 0  # measured at load, for Status
    kv_bytes_per_token_float: int = 0  # the same with the model's own float cache
    # "text": a causal LM (chat, and Embedding/Score from its hidden states and logits);
    # "vision": served by vision_batch, media prepared by vision_prepare;
    # "embedding": an encoder that only embeds (embed_loader);
    # "reranker": a cross-encoder that only reranks (cross_encoder);
    # "speech-to-text", "text-to-speech", "voice-activity": mlx-audio's models (audio_model).
    # What it serves follows from it (`serves`): the servicer and the forward passes ask that, never the kind.
    kind: str = "text"
    vision: Any = None  # vision_model.VisionParts of a vision model
    audio: Any = None  # audio_model.AudioParts of an audio model
    embedding: Any = None  # embed_loader.EmbeddingSpec: pooling and normalisation
    # Set by LoadModel after the load, each into a new value (dataclasses.replace):
    text_limits: limits.TextLimits = field(default_factory=limits.TextLimits)  # the per-request text budgets
    speculation: Any = None  # engine.speculation.spec_config.Settings (None: its defaults)
    lane: Lane = field(default_factory=Lane)  # the batch, unless the check at load chose otherwise
    load_id: Optional[int] = None  # across ranks: the load every rank holds, which the followers swap to
    parallel: str = ""  # across ranks: how the model is divided ("tensor" or "pipeline"); "" in one process
    ranks: int = 1  # the processes the model is divided over
    memo: Memo = field(default_factory=Memo, compare=False, repr=False)  # what is computed from it on demand

    @property
    def serves(self) -> Serves:
        return SERVES[self.kind]

    def detokenizer(self):
        """A fresh streaming detokenizer that keeps every character.

        mlx-lm's drop a leading space from the first token (they decode a
        completion as if it were a whole text); a continuation must keep it.
        """
        from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, SPMStreamingDetokenizer

        detok = self.tokenizer.detokenizer
        if isinstance(detok, BPEStreamingDetokenizer):
            detok._maybe_trim_space = _keep
        elif isinstance(detok, SPMStreamingDetokenizer):
            detok.trim_space = False
        return detok


def _keep(text: str) -> str:
    return text


def materialize(model) -> None:
    """Evaluate every array the model holds, private ones (rope tables) included."""
    # dict.values, not the module's own keys(): a family may name a child or a method "keys"; and only
    # what is a module (Qwen3-TTS's speech tokenizer lists a function among its modules).
    evaluate([(list(dict.values(module)), list(vars(module).values())) for module in model.modules()
              if issubclass(type(module), dict)])


def evaluate(value) -> None:
    """Evaluate every array in `value` (nested lists, dicts, the libraries' output objects) on this
    thread. A graph built on the loading thread only to be looked at (its shapes) must still be
    computed there: the libraries cache some of its arrays across calls (mlx-vlm's interpolation
    tables, in module-level lru_caches keyed by sizes), and such an array left lazy fails on the
    engine thread, the first time a request of the same size uses it ("There is no Stream(cpu, N)
    in current thread")."""
    import mlx.core as mx

    arrays = []
    _collect(value, arrays, set())
    mx.eval(arrays)


def _collect(value, arrays: list, seen: set) -> None:
    import mlx.core as mx
    import mlx.nn as nn

    if issubclass(type(value), nn.Module):
        # A module held as a plain attribute, outside model.modules() (Spark's codec): its own
        # arrays and attributes, walked once.
        if id(value) not in seen:
            seen.add(id(value))
            _collect([list(dict.values(value)), list(vars(value).values())], arrays, seen)
    elif isinstance(value, mx.array):
        arrays.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _collect(v, arrays, seen)
    elif isinstance(value, dict):
        for v in value.values():
            _collect(v, arrays, seen)
    elif _model_helper(value) and id(value) not in seen:
        # A plain object of the model's code (Pixtral's and Llama 4's vision rope tables, an
        # embedding step's outputs): left lazy, its arrays would be computed on the engine thread
        # from this (loading) thread's stream, which MLX refuses there ("There is no Stream(cpu, 1)").
        seen.add(id(value))
        _collect(list(vars(value).values()), arrays, seen)


def _model_helper(value) -> bool:
    """An object of the libraries' model code that is not itself a module (modules are walked
    by model.modules())."""
    import mlx.nn as nn

    owner = type(value).__module__.split(".")[0]
    return owner in ("mlx_lm", "mlx_vlm", "mlx_embeddings", "mlx_audio") and hasattr(value, "__dict__") \
        and not isinstance(value, nn.Module)
