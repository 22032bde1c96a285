"""PredictOptions -> engine Request: prompt rendering, tokenization, options.

Runs on the preparation thread (chat templates and tokenizers are too slow for
the event loop) and never touches MLX. Bad input raises OptionError, which the
servicer turns into INVALID_ARGUMENT.
"""

import base64
import binascii
import logging
import math
import os
from typing import Any, Dict, List, Tuple

from common.mlx_utils import OutputRouter
from common.python_utils import (OptionError, messages_to_dicts, option_float, option_int,
                                 parse_bool, parse_json_field, parse_tools)
from engine import EngineError, Request, snapshots
from engine import faults
from engine.sampling import SamplingParams
import limits
from render_guard import bounded

log = logging.getLogger("mlx-backend.prepare")

MAX_TOP_LOGPROBS = 20
# Fields a host may send that MLX samplers cannot express: logged once each.
UNSUPPORTED = {"TypicalP": 1.0, "TailFreeSamplingZ": 1.0, "Mirostat": 0, "NegativePrompt": ""}
_warned = set()

# chat_template_kwargs fill the template's variables; these keys would instead steer the
# renderer (transformers' apply_chat_template and render_jinja_template, its processor's
# variant, mlx-vlm's get_chat_template) or replace what we pass it: the template itself,
# tokenizing, the conversation, the tools. The model's template is the only template.
RENDERER_KEYS = frozenset({
    "chat_template", "tokenize", "return_dict", "return_tensors", "return_assistant_tokens_mask",
    "add_generation_prompt", "continue_final_message", "sanitize_control_tokens", "padding",
    "truncation", "max_length", "conversation", "conversations", "messages", "tools", "documents",
    "processor", "load_audio_from_video", "num_images", "num_frames", "fps", "video_fps",
    "sampling_rate", "do_sample_frames", "video_load_backend",
})


def _renderer_key(key: str) -> bool:
    return key in RENDERER_KEYS or key.endswith("_kwargs")  # tokenizer_kwargs, processor_kwargs, ...


def template_kwargs(opts, model_options: Dict[str, Any], depth: int = limits.TextLimits.max_json_depth
                    ) -> Dict[str, Any]:
    """Extra chat-template variables: thinking switch, effort, free-form kwargs."""
    meta = dict(opts.Metadata)
    kwargs: Dict[str, Any] = {}
    if "enable_thinking" in model_options:
        kwargs["enable_thinking"] = bool(model_options["enable_thinking"])
    if "chat_template_kwargs" in meta and meta["chat_template_kwargs"].strip():
        extra = parse_json_field("Metadata.chat_template_kwargs", meta["chat_template_kwargs"], dict, depth)
        for key in extra:
            if _renderer_key(key):
                raise OptionError(f"Metadata.chat_template_kwargs: key {key!r} is not a template variable "
                                  "(it would steer the renderer; the model's own template is used)")
        kwargs.update(extra)
    if "enable_thinking" in meta:
        kwargs["enable_thinking"] = parse_bool("Metadata.enable_thinking", meta["enable_thinking"])
    if meta.get("reasoning_effort"):
        kwargs["reasoning_effort"] = meta["reasoning_effort"]
    return kwargs


def render_prompt(lm, opts, tools, upto: int = 0) -> str:
    """The chat template applied to Messages (with the parsed Tools), as text. With `upto`
    (< 0), only Messages[:upto] and no generation prompt: the conversation before its last
    messages, as the template renders it."""
    tok = lm.tokenizer
    if not tok.has_chat_template:
        raise OptionError("Messages: this model has no chat template; send a raw Prompt")
    bound = limits.of(lm)
    messages = messages_to_dicts(opts.Messages, strict=True, max_depth=bound.max_json_depth)
    kwargs = template_kwargs(opts, lm.options, bound.max_json_depth)
    try:
        with bounded("Messages", bound.template_seconds, bound.template_output_bytes):
            return tok.apply_chat_template(
                messages[:upto] if upto else messages, tools=tools, add_generation_prompt=not upto,
                tokenize=False, **kwargs)
    except (OptionError, EngineError):
        raise
    except Exception as e:  # jinja errors: the template rejected these messages
        raise OptionError(f"Messages: the chat template failed: {type(e).__name__}: {e}") from None


def chat_boundaries(lm, opts, tools, text: str, tokens: List[int]) -> List[int]:
    """Where the last message of a rendered chat starts, in prompt tokens ([] when unknown).

    The next turn of the chat keeps everything before it and differs from there on (its
    own reply, edited or not, and a new message), so a model whose cache cannot be
    trimmed back (engine.snapshots) keeps a snapshot there. The other models never pay
    for the second render. Found as the tokens the full prompt shares with the render of
    the messages before the last one, when that render is a prefix of the full one's text.
    """
    if len(opts.Messages) < 2 or getattr(lm, "kind", "text") != "text" or not snapshots.wanted_for(lm):
        return []
    try:
        head = render_prompt(lm, opts, tools, upto=-1)
    except (OptionError, EngineError):  # a template that refuses the shorter chat: no boundary
        return []
    if not head or not text.startswith(head):
        return []
    ids = lm.tokenizer.encode(head, add_special_tokens=False)
    shared = 0
    for a, b in zip(ids, tokens):
        if a != b:
            break
        shared += 1
    return [shared] if 0 < shared < len(tokens) else []


MESSAGE_TEXT = ("role", "content", "name", "tool_call_id", "reasoning_content", "tool_calls")


def check_text(opts, bound: limits.TextLimits) -> None:
    """The request's text against its bounds, before anything is parsed, rendered or tokenized."""
    if len(opts.Messages) > bound.max_messages:
        raise OptionError(f"Messages: {len(opts.Messages)} given; at most {bound.max_messages} "
                          "(option max_messages)")
    size = sum(len(getattr(opts, f).encode("utf-8")) for f in ("Prompt", "Tools", "Grammar", "LogitBias"))
    size += sum(len(k.encode("utf-8")) + len(v.encode("utf-8")) for k, v in opts.Metadata.items())
    for m in opts.Messages:
        size += sum(len(getattr(m, f).encode("utf-8")) for f in MESSAGE_TEXT)
    if size > bound.max_prompt_bytes:
        raise OptionError(f"Prompt: Prompt, Messages, Tools, Grammar, LogitBias and Metadata add up to {size} bytes; at most "
                          f"{bound.max_prompt_bytes} (option max_prompt_bytes)")
    stops = [s for s in opts.StopPrompts if s]
    if len(stops) > bound.max_stop_strings:
        raise OptionError(f"StopPrompts: {len(stops)} given; at most {bound.max_stop_strings} "
                          "(option max_stop_strings)")
    total = 0
    for i, s in enumerate(opts.StopPrompts):
        n = len(s.encode("utf-8"))
        if n > bound.max_stop_bytes:
            raise OptionError(f"StopPrompts[{i}]: {n} bytes; at most {bound.max_stop_bytes} "
                              "(option max_stop_bytes)")
        total += n
    if total > bound.max_stop_total_bytes:
        raise OptionError(f"StopPrompts: {total} bytes together; at most {bound.max_stop_total_bytes} "
                          "(option max_stop_total_bytes)")


def request_tools(lm, opts):
    return parse_tools(opts.Tools, limits.of(lm).max_json_depth)


def chat_rendered(opts) -> bool:
    """Whether the prompt is the chat template applied to Messages (not the raw Prompt)."""
    return bool(opts.Messages) and (opts.UseTokenizerTemplate or not opts.Prompt)


def prompt(lm, opts, tools=None) -> Tuple[str, List[int]]:
    """The request's prompt as text and token ids (chat-rendered when Messages are used)."""
    tok = lm.tokenizer
    if chat_rendered(opts):
        text = render_prompt(lm, opts, request_tools(lm, opts) if tools is None else tools)
        return text, tok.encode(text, add_special_tokens=False)
    bos = tok.bos_token
    return opts.Prompt, tok.encode(opts.Prompt, add_special_tokens=not (bos and opts.Prompt.startswith(bos)))


def prompt_tokens(lm, opts) -> List[int]:
    """TokenizeString: what the tokenizer makes of the prompt, the empty one included."""
    check_text(opts, limits.of(lm))
    if opts.Messages and getattr(lm, "kind", "text") in ("embedding", "reranker"):
        raise OptionError("Messages: the loaded model is an encoder without a chat template; send a Prompt")
    if getattr(lm, "kind", "text") == "vision":  # image tokens counted as the model will see them
        return media_prompt(lm, opts, request_tools(lm, opts))[1]
    return prompt(lm, opts)[1]


def media_prompt(lm, opts, tools):
    """(text, token ids, media or None): a vision model expands its images into image tokens."""
    if getattr(lm, "kind", "text") == "vision":
        from vision_prepare import vision_prompt

        found = vision_prompt(lm, opts, tools, template_kwargs(opts, lm.options, limits.of(lm).max_json_depth))
        if found is not None:
            return found
    else:
        check_media(opts)
    return (*prompt(lm, opts, tools), None)


def _pick(value, options: Dict[str, Any], name: str, default, caster=float, minimum=None, maximum=None):
    """The request's value when set (non-zero), else the model option, else default."""
    if value:
        return value
    if caster is int:
        return option_int(options, name, default, minimum)
    return option_float(options, name, default, minimum, maximum)


def _warn_unsupported(opts) -> None:
    for name, neutral in UNSUPPORTED.items():
        value = getattr(opts, name)
        if value and value != neutral and name not in _warned:
            _warned.add(name)
            log.warning("%s=%r is not supported by the MLX samplers and is ignored", name, value)


def logit_bias(text: str, vocab: int) -> Dict[int, float]:
    """LogitBias: a JSON object of token id -> additive bias."""
    if not text.strip():
        return {}
    raw = parse_json_field("LogitBias", text, dict)
    bias = {}
    for key, value in raw.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise OptionError(f"LogitBias: key {key!r} is not a token id") from None
        if not 0 <= token < vocab:
            raise OptionError(f"LogitBias: token id {token} is outside the vocabulary [0, {vocab})")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise OptionError(f"LogitBias: bias for {token} must be a number")
        bias[token] = max(-100.0, min(100.0, float(value)))
    return bias


FLOAT_FIELDS = ("Temperature", "TopP", "MinP", "Penalty", "PresencePenalty", "FrequencyPenalty",
                "TypicalP", "TailFreeSamplingZ")


def check_media(opts) -> None:
    """Images, videos and audio arrive base64; this backend serves text models."""
    for name in ("Images", "Videos", "Audios"):
        for i, item in enumerate(getattr(opts, name)):
            data = item.split(",", 1)[1] if item.startswith("data:") else item
            try:
                base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError):
                raise OptionError(f"{name}[{i}]: not valid base64") from None
        if getattr(opts, name):
            raise OptionError(f"{name}: the loaded model takes text only")


def sampling_params(opts, options: Dict[str, Any], vocab: int = 1 << 31) -> SamplingParams:
    for name in FLOAT_FIELDS:
        if not math.isfinite(getattr(opts, name)):
            raise OptionError(f"{name}: must be a finite number")
    if opts.Temperature < 0:
        raise OptionError(f"Temperature: must be >= 0, got {opts.Temperature}")
    if not 0 <= opts.TopP <= 1:
        raise OptionError(f"TopP: must be within [0, 1], got {opts.TopP}")
    if opts.TopK < 0:
        raise OptionError(f"TopK: must be >= 0, got {opts.TopK}")
    if not 0 <= opts.MinP <= 1:
        raise OptionError(f"MinP: must be within [0, 1], got {opts.MinP}")
    if opts.Penalty < 0:
        raise OptionError(f"Penalty: must be >= 0, got {opts.Penalty}")
    for name in ("PresencePenalty", "FrequencyPenalty"):
        if not -2 <= getattr(opts, name) <= 2:
            raise OptionError(f"{name}: must be within [-2, 2], got {getattr(opts, name)}")
    _warn_unsupported(opts)
    seed = opts.Seed or option_int(options, "seed", 0)
    return SamplingParams(
        temperature=_pick(opts.Temperature, options, "temperature", 0.0, minimum=0.0),
        top_p=_pick(opts.TopP, options, "top_p", 1.0, minimum=0.0, maximum=1.0),
        top_k=_pick(opts.TopK, options, "top_k", 0, int, minimum=0),
        min_p=_pick(opts.MinP, options, "min_p", 0.0, minimum=0.0, maximum=1.0),
        seed=seed if seed else int.from_bytes(os.urandom(4), "little"),
        repetition_penalty=_pick(opts.Penalty, options, "repetition_penalty", 0.0, minimum=0.0),
        repetition_context_size=option_int(options, "repetition_context_size", 20, minimum=1),
        presence_penalty=_pick(opts.PresencePenalty, options, "presence_penalty", 0.0),
        frequency_penalty=_pick(opts.FrequencyPenalty, options, "frequency_penalty", 0.0),
        logit_bias=logit_bias(opts.LogitBias, vocab),
        xtc_probability=option_float(options, "xtc_probability", 0.0, 0.0, 1.0),
        xtc_threshold=option_float(options, "xtc_threshold", 0.1, 0.0, 0.5),
    )


def _rebuildable(processor, *spec):
    """Tag a logits processor with how to build it again, for the other ranks of a group (lockstep)."""
    processor.remote = spec
    return processor


def build_request(lm, opts) -> Request:
    bound = limits.of(lm)
    check_text(opts, bound)
    if opts.Tokens < 0:
        raise OptionError(f"Tokens: must be >= 0 (0 means until the end of the sequence), got {opts.Tokens}")
    for name in ("Logprobs", "TopLogprobs"):
        if not 0 <= getattr(opts, name) <= MAX_TOP_LOGPROBS:
            raise OptionError(f"{name}: must be within [0, {MAX_TOP_LOGPROBS}], got {getattr(opts, name)}")
    vocab = int(lm.config.get("vocab_size") or len(lm.tokenizer))
    sampling = sampling_params(opts, lm.options, vocab)
    sampling.xtc_special_tokens = sorted(lm.tokenizer.eos_token_ids)
    extra, meta = [], dict(opts.Metadata)
    fault = faults.plan(meta)  # tests only (MLX_BACKEND_FAULT_INJECTION=1)
    if fault.at_token is not None:
        extra.append(_rebuildable(faults.processor(fault.at_token), "fault_at", fault.at_token))
    from engine import grammar

    source = grammar.grammar_source(opts.Grammar, meta, bound.max_json_depth)
    if source is not None:
        extra.append(_rebuildable(faults.grammar(grammar.compile_processor(lm, *source), fault.grammar_at),
                                  "grammar", *source, fault.grammar_at))
    if not 0 <= opts.NDraft <= 32:
        raise OptionError(f"NDraft: must be within [0, 32] (0: the model's default), got {opts.NDraft}")
    n_draft = opts.NDraft or None
    if "speculation" in meta:  # per request: off, or on with the model's settings
        n_draft = n_draft if parse_bool("Metadata.speculation", meta["speculation"]) else 0
    tools = request_tools(lm, opts)
    text, tokens, media = media_prompt(lm, opts, tools)
    if not text:  # TokenizeString takes the empty prompt; generating from nothing is refused
        raise OptionError("Prompt: empty (send a Prompt or Messages)")
    if not tokens:
        raise OptionError("Prompt: it tokenizes to nothing")
    room = lm.context_size - len(tokens)
    if room <= 0:
        raise EngineError(
            "RESOURCE_EXHAUSTED",
            f"the prompt is {len(tokens)} tokens; the context holds {lm.context_size}")
    asked = opts.Tokens or option_int(lm.options, "max_tokens", 0, minimum=0)
    boundaries = chat_boundaries(lm, opts, tools, text, tokens) if media is None and chat_rendered(opts) else []
    request = Request(prompt=tokens, max_tokens=min(asked or room, room), open_ended=not asked, sampling=sampling,
                      stops=[s for s in opts.StopPrompts if s], model_epoch=lm.epoch,
                      label=opts.CorrelationId, ignore_eos=opts.IgnoreEOS,
                      logprobs=opts.Logprobs > 0 or opts.TopLogprobs > 0,
                      top_logprobs=opts.TopLogprobs, processors=extra, n_draft=n_draft, media=media,
                      router=OutputRouter.for_tokenizer(lm.tokenizer, tools, text), boundaries=boundaries)
    faults.attach(request, fault)
    return request
