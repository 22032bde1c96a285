"""A generation request -> engine Request: prompt rendering, tokenization, its checks.

Runs on the preparation thread (chat templates and tokenizers are too slow for
the event loop) and never touches MLX. Everything is read from the request's
spec (spec.read), checked in the order below. Bad input raises OptionError, which
the servicer turns into INVALID_ARGUMENT.
"""

from typing import Any, Dict, List, Tuple

from common.mlx_utils import OutputRouter
from common.python_utils import OptionError, parse_bool, parse_json_field, parse_tools
from engine import EngineError, Request
from engine.prefix import snapshots

from . import faults, media
from .render_guard import bounded
from .sampling import sampling_params
from .spec import RequestSpec, read

MAX_TOP_LOGPROBS = 20

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


def template_kwargs(spec: RequestSpec) -> Dict[str, Any]:
    """Extra chat-template variables: thinking switch, effort, free-form kwargs."""
    kwargs: Dict[str, Any] = {}
    if spec.defaults.enable_thinking is not None:  # the model's load option
        kwargs["enable_thinking"] = bool(spec.defaults.enable_thinking)
    if spec.chat_template_kwargs.strip():
        extra = parse_json_field("Metadata.chat_template_kwargs", spec.chat_template_kwargs, dict,
                                 spec.bounds.max_json_depth)
        for key in extra:
            if _renderer_key(key):
                raise OptionError(f"Metadata.chat_template_kwargs: key {key!r} is not a template variable "
                                  "(it would steer the renderer; the model's own template is used)")
        kwargs.update(extra)
    if spec.enable_thinking is not None:
        kwargs["enable_thinking"] = parse_bool("Metadata.enable_thinking", spec.enable_thinking)
    if spec.reasoning_effort:
        kwargs["reasoning_effort"] = spec.reasoning_effort
    return kwargs


def render_prompt(lm, spec: RequestSpec, tools, upto: int = 0) -> str:
    """The chat template applied to Messages (with the parsed Tools), as text. With `upto`
    (< 0), only Messages[:upto] and no generation prompt: the conversation before its last
    messages, as the template renders it."""
    tok = lm.tokenizer
    if not tok.has_chat_template:
        raise OptionError("Messages: this model has no chat template; send a raw Prompt")
    bound = spec.bounds
    messages = spec.chat_messages()
    kwargs = template_kwargs(spec)
    try:
        with bounded("Messages", bound.template_seconds, bound.template_output_bytes):
            return tok.apply_chat_template(
                messages[:upto] if upto else messages, tools=tools, add_generation_prompt=not upto,
                tokenize=False, **kwargs)
    except (OptionError, EngineError):
        raise
    except Exception as e:  # jinja errors: the template rejected these messages
        raise OptionError(f"Messages: the chat template failed: {type(e).__name__}: {e}") from None


def chat_boundaries(lm, spec: RequestSpec, tools, text: str, tokens: List[int]) -> List[int]:
    """Where the last message of a rendered chat starts, in prompt tokens ([] when unknown).

    The next turn of the chat keeps everything before it and differs from there on (its
    own reply, edited or not, and a new message), so a model whose cache cannot be
    trimmed back (engine.prefix.snapshots) keeps a snapshot there. The other models never pay
    for the second render. Found as the tokens the full prompt shares with the render of
    the messages before the last one, when that render is a prefix of the full one's text.
    Only the text batch keeps snapshots: a model that takes media has none.
    """
    serves = lm.serves
    if len(spec.messages) < 2 or not serves.generate or serves.media or not snapshots.wanted_for(lm):
        return []
    try:
        head = render_prompt(lm, spec, tools, upto=-1)
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


def check_text(spec: RequestSpec) -> None:
    """The request's text against its bounds, before anything is parsed, rendered or tokenized."""
    bound = spec.bounds
    if len(spec.messages) > bound.max_messages:
        raise OptionError(f"Messages: {len(spec.messages)} given; at most {bound.max_messages} "
                          "(option max_messages)")
    size = sum(len(t.encode("utf-8")) for t in (spec.prompt, spec.tools, spec.grammar, spec.sampling.logit_bias))
    size += sum(len(k.encode("utf-8")) + len(v.encode("utf-8")) for k, v in spec.metadata.items())
    for m in spec.messages:
        size += sum(len(getattr(m, f).encode("utf-8")) for f in MESSAGE_TEXT)
    if size > bound.max_prompt_bytes:
        raise OptionError(f"Prompt: Prompt, Messages, Tools, Grammar, LogitBias and Metadata add up to {size} bytes; at most "
                          f"{bound.max_prompt_bytes} (option max_prompt_bytes)")
    stops = [s for s in spec.stops if s]
    if len(stops) > bound.max_stop_strings:
        raise OptionError(f"StopPrompts: {len(stops)} given; at most {bound.max_stop_strings} "
                          "(option max_stop_strings)")
    total = 0
    for i, s in enumerate(spec.stops):
        n = len(s.encode("utf-8"))
        if n > bound.max_stop_bytes:
            raise OptionError(f"StopPrompts[{i}]: {n} bytes; at most {bound.max_stop_bytes} "
                              "(option max_stop_bytes)")
        total += n
    if total > bound.max_stop_total_bytes:
        raise OptionError(f"StopPrompts: {total} bytes together; at most {bound.max_stop_total_bytes} "
                          "(option max_stop_total_bytes)")


def request_tools(spec: RequestSpec):
    return parse_tools(spec.tools, spec.bounds.max_json_depth)


def prompt(lm, spec: RequestSpec, tools=None) -> Tuple[str, List[int]]:
    """The request's prompt as text and token ids (chat-rendered when Messages are used)."""
    tok = lm.tokenizer
    if spec.chat_rendered:
        text = render_prompt(lm, spec, request_tools(spec) if tools is None else tools)
        return text, tok.encode(text, add_special_tokens=False)
    bos = tok.bos_token
    return spec.prompt, tok.encode(spec.prompt, add_special_tokens=not (bos and spec.prompt.startswith(bos)))


def prompt_tokens(lm, opts) -> List[int]:
    """TokenizeString: what the tokenizer makes of the prompt, the empty one included."""
    spec = read(lm, opts)
    check_text(spec)
    if spec.messages and not lm.serves.generate:
        raise OptionError("Messages: the loaded model is an encoder without a chat template; send a Prompt")
    if lm.serves.media:  # media tokens counted as the model will see them
        return media_prompt(lm, spec, request_tools(spec))[1]
    return prompt(lm, spec)[1]


def media_prompt(lm, spec: RequestSpec, tools):
    """(text, token ids, media or None): a model that takes media expands them into its tokens."""
    if lm.serves.media:
        from .vision import vision_prompt

        found = vision_prompt(lm, spec, tools, template_kwargs(spec))
        if found is not None:
            return found
    else:
        media.refuse_for_text(spec)
    return (*prompt(lm, spec, tools), None)


def _check_counts(spec: RequestSpec) -> None:
    if spec.max_tokens < 0:
        raise OptionError(f"Tokens: must be >= 0 (0 means until the end of the sequence), got {spec.max_tokens}")
    for name, value in (("Logprobs", spec.logprobs), ("TopLogprobs", spec.top_logprobs)):
        if not 0 <= value <= MAX_TOP_LOGPROBS:
            raise OptionError(f"{name}: must be within [0, {MAX_TOP_LOGPROBS}], got {value}")


def _processors(lm, spec: RequestSpec) -> Tuple[list, "faults.Plan"]:
    """(logits processors beyond sampling: a grammar, injected faults; the fault plan)."""
    extra, plan = faults.requested_faults(spec.metadata)
    from engine.lanes import grammar

    source = grammar.grammar_source(spec.grammar, spec.metadata, spec.bounds.max_json_depth)
    if source is not None:
        extra.append(faults.grammar_processor(grammar.compile_processor(lm, *source), source, plan))
    return extra, plan


def _n_draft(spec: RequestSpec):
    """Tokens to draft per step: None (the model's settings), 0 (off) or a number."""
    if not 0 <= spec.n_draft <= 32:
        raise OptionError(f"NDraft: must be within [0, 32] (0: the model's default), got {spec.n_draft}")
    n_draft = spec.n_draft or None
    if spec.speculation is not None:  # per request: off, or on with the model's settings
        n_draft = n_draft if parse_bool("Metadata.speculation", spec.speculation) else 0
    return n_draft


def _room(lm, text: str, tokens: List[int]) -> int:
    """Tokens the context has left after the prompt (a prompt that fills it is refused)."""
    if not text:  # TokenizeString takes the empty prompt; generating from nothing is refused
        raise OptionError("Prompt: empty (send a Prompt or Messages)")
    if not tokens:
        raise OptionError("Prompt: it tokenizes to nothing")
    room = lm.context_size - len(tokens)
    if room <= 0:
        raise EngineError(
            "RESOURCE_EXHAUSTED",
            f"the prompt is {len(tokens)} tokens; the context holds {lm.context_size}")
    return room


def build_request(lm, opts) -> Request:
    """The engine Request of a PredictOptions (or of its spec) for loaded model `lm`."""
    spec = read(lm, opts)
    check_text(spec)
    _check_counts(spec)
    vocab = int(lm.config.get("vocab_size") or len(lm.tokenizer))
    sampling = sampling_params(spec, vocab)
    sampling.xtc_special_tokens = sorted(lm.tokenizer.eos_token_ids)
    extra, fault = _processors(lm, spec)  # fault: tests only
    n_draft = _n_draft(spec)
    tools = request_tools(spec)
    text, tokens, media_inputs = media_prompt(lm, spec, tools)
    room = _room(lm, text, tokens)
    asked = spec.max_tokens or spec.defaults.max_tokens
    boundaries = (chat_boundaries(lm, spec, tools, text, tokens)
                  if media_inputs is None and spec.chat_rendered else [])
    request = Request(prompt=tokens, max_tokens=min(asked or room, room), open_ended=not asked, sampling=sampling,
                      stops=[s for s in spec.stops if s], model_epoch=lm.epoch,
                      label=spec.label, ignore_eos=spec.ignore_eos,
                      logprobs=spec.logprobs > 0 or spec.top_logprobs > 0,
                      top_logprobs=spec.top_logprobs, processors=extra, n_draft=n_draft, media=media_inputs,
                      router=OutputRouter.for_tokenizer(lm.tokenizer, tools, text), boundaries=boundaries)
    faults.attach(request, fault)
    return request
