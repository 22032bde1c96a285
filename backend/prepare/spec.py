"""A generation request's PredictOptions, read once into one typed spec (preparation thread).

Every field and Metadata key that preparation reads is copied here, next to the
loaded model's own defaults (its load options, load_options.Settings) and text
bounds (limits.TextLimits). Reading never fails: the checks run afterwards, from
the spec, in the order the request's work needs them (text.py), so a request with
two faults is refused for the same one as before. What is parsed (the Messages)
is parsed once and kept.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from common.python_utils import messages_to_dicts
import limits
import load_options


@dataclass(frozen=True)
class SamplingFields:
    """The request's sampling fields as sent; 0 (or empty) means the model's default."""
    temperature: float = 0.0
    top_p: float = 0.0
    top_k: int = 0
    min_p: float = 0.0
    penalty: float = 0.0  # repetition penalty
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = 0
    logit_bias: str = ""  # JSON: token id -> bias
    # Sent by some hosts, not expressible by MLX samplers (logged once each, else ignored).
    typical_p: float = 0.0
    tail_free_z: float = 0.0
    mirostat: int = 0
    negative_prompt: str = ""

    def field(self, proto_name: str) -> Any:
        """A value by its PredictOptions name, as refusals name it."""
        return getattr(self, PROTO_NAMES[proto_name])


# PredictOptions field -> SamplingFields attribute.
PROTO_NAMES = {
    "Temperature": "temperature", "TopP": "top_p", "TopK": "top_k", "MinP": "min_p", "Penalty": "penalty",
    "PresencePenalty": "presence_penalty", "FrequencyPenalty": "frequency_penalty", "Seed": "seed",
    "LogitBias": "logit_bias", "TypicalP": "typical_p", "TailFreeSamplingZ": "tail_free_z",
    "Mirostat": "mirostat", "NegativePrompt": "negative_prompt",
}


@dataclass
class RequestSpec:
    prompt: str = ""
    messages: Tuple[Any, ...] = ()  # proto Messages, as sent (check_text measures their fields)
    use_template: bool = False  # UseTokenizerTemplate
    tools: str = ""  # JSON array of tools
    grammar: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)
    stops: Tuple[str, ...] = ()  # StopPrompts, empty ones included (as check_text counts them)
    max_tokens: int = 0  # Tokens: 0 means the model's max_tokens, else to the context's end
    logprobs: int = 0
    top_logprobs: int = 0
    n_draft: int = 0  # NDraft: 0 means the model's speculation settings
    ignore_eos: bool = False
    label: str = ""  # CorrelationId, for the log
    images: Tuple[str, ...] = ()  # base64, each may carry a `data:` prefix
    videos: Tuple[str, ...] = ()
    audios: Tuple[str, ...] = ()
    sampling: SamplingFields = field(default_factory=SamplingFields)
    defaults: Any = field(default_factory=load_options.Settings)  # the model's load options
    bounds: limits.TextLimits = field(default_factory=limits.TextLimits)
    _messages: Optional[List[Dict[str, Any]]] = field(default=None, repr=False)

    # ---- Metadata keys preparation reads -------------------------------------

    @property
    def enable_thinking(self) -> Optional[str]:
        """Metadata.enable_thinking as sent (the chat template's thinking switch), or None."""
        return self.metadata.get("enable_thinking")

    @property
    def chat_template_kwargs(self) -> str:
        """Metadata.chat_template_kwargs: JSON object of extra template variables."""
        return self.metadata.get("chat_template_kwargs", "")

    @property
    def reasoning_effort(self) -> str:
        return self.metadata.get("reasoning_effort", "")

    @property
    def speculation(self) -> Optional[str]:
        """Metadata.speculation as sent (per request: off, or on with the model's settings), or None."""
        return self.metadata.get("speculation")

    # ---- what follows from the fields ------------------------------------------

    @property
    def chat_rendered(self) -> bool:
        """Whether the prompt is the chat template applied to Messages (not the raw Prompt)."""
        return bool(self.messages) and (self.use_template or not self.prompt)

    @property
    def has_media(self) -> bool:
        return bool(self.images or self.videos or self.audios)

    def media(self, name: str) -> Tuple[str, ...]:
        """The items of "Images", "Videos" or "Audios"."""
        return {"Images": self.images, "Videos": self.videos, "Audios": self.audios}[name]

    def chat_messages(self) -> List[Dict[str, Any]]:
        """The Messages as chat templates take them, parsed (strictly) on first use only."""
        if self._messages is None:
            self._messages = messages_to_dicts(self.messages, strict=True, max_depth=self.bounds.max_json_depth)
        return self._messages


def read(lm, opts) -> RequestSpec:
    """The spec of PredictOptions `opts` for loaded model `lm` (a spec is passed through)."""
    if isinstance(opts, RequestSpec):
        return opts
    return RequestSpec(
        prompt=opts.Prompt, messages=tuple(opts.Messages), use_template=opts.UseTokenizerTemplate,
        tools=opts.Tools, grammar=opts.Grammar, metadata=dict(opts.Metadata), stops=tuple(opts.StopPrompts),
        max_tokens=opts.Tokens, logprobs=opts.Logprobs, top_logprobs=opts.TopLogprobs, n_draft=opts.NDraft,
        ignore_eos=opts.IgnoreEOS, label=opts.CorrelationId,
        images=tuple(opts.Images), videos=tuple(opts.Videos), audios=tuple(opts.Audios),
        sampling=SamplingFields(**{attr: getattr(opts, name) for name, attr in PROTO_NAMES.items()}),
        defaults=load_options.settings(lm.options), bounds=limits.of(lm))
