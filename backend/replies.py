"""Engine results -> the proto replies the host reads (pure translation, no model work).

Functions that decode token texts or render a template run on the preparation
thread (the servicer says where); the rest are cheap enough for the event loop.
"""

import json
import logging

import backend_pb2
from common.mlx_utils import Delta, ToolCall
from common.python_utils import OptionError
import limits
import prepare
from prepare.render_guard import bounded

log = logging.getLogger("mlx-backend")


def reply(ev, deltas) -> "backend_pb2.Reply":
    """A Reply: content text in `message`, every channel in `chat_deltas`, running totals."""
    out = backend_pb2.Reply(
        message="".join(d.content for d in deltas).encode("utf-8"), tokens=ev.tokens,
        prompt_tokens=ev.prompt_tokens, timing_prompt_processing=ev.prompt_ms,
        timing_token_generation=ev.gen_ms)
    for d in deltas:
        out.chat_deltas.append(backend_pb2.ChatDelta(
            content=d.content, reasoning_content=d.reasoning,
            tool_calls=[backend_pb2.ToolCallDelta(index=c.index, id=c.id, name=c.name, arguments=c.arguments)
                        for c in d.tool_calls]))
    if ev.logprobs is not None:
        out.logprobs = json.dumps({"content": ev.logprobs}, ensure_ascii=False).encode("utf-8")
    return out


def merge_deltas(deltas) -> Delta:
    """The streamed deltas merged as the host merges them: one ChatDelta for Predict."""
    calls = {}
    for d in deltas:
        for c in d.tool_calls:
            merged = calls.setdefault(c.index, ToolCall(index=c.index))
            merged.id = c.id or merged.id
            merged.name = c.name or merged.name
            merged.arguments += c.arguments
    return Delta(content="".join(d.content for d in deltas),
                 reasoning="".join(d.reasoning for d in deltas),
                 tool_calls=[calls[i] for i in sorted(calls)])


def detokenize(lm, tokens) -> str:
    """Detokenize's ids, range-checked, as text (prep thread)."""
    vocab = len(lm.tokenizer)
    bad = [t for t in tokens if not 0 <= t < vocab][:5]
    if bad:
        raise OptionError(f"tokens: ids out of range [0, {vocab}): {bad}")
    return lm.tokenizer.decode(list(tokens))


def embedding_result(lm, result) -> "backend_pb2.EmbeddingResult":
    (vectors,) = result.vectors
    Layout = backend_pb2.EmbeddingLayout
    return backend_pb2.EmbeddingResult(
        embeddings=[x for v in vectors for x in v], tokens=len(vectors), dim=len(vectors[0]),
        prompt_tokens=result.prompt_tokens,
        layout=Layout.EMBEDDING_LAYOUT_PER_TOKEN if lm.embedding.pooling == "none"
        else Layout.EMBEDDING_LAYOUT_FINAL)


def score_response(lm, result, length_normalize: bool, per_token: bool) -> "backend_pb2.ScoreResponse":
    """Candidate scores as the host reads them (prep thread: token texts are decoded here)."""
    out = backend_pb2.ScoreResponse()
    for tokens, logprobs in zip(result.tokens, result.logprobs):
        c = out.candidates.add(log_prob=sum(logprobs), num_tokens=len(tokens))
        if length_normalize:
            c.length_normalized_log_prob = c.log_prob / max(len(tokens), 1)
        if per_token:
            for t, lp in zip(tokens, logprobs):
                c.tokens.add(token=lm.tokenizer.decode([t]), log_prob=lp)
    return out


def rerank_result(documents, scores, order, evaluated: int) -> "backend_pb2.RerankResult":
    return backend_pb2.RerankResult(
        usage=backend_pb2.Usage(total_tokens=evaluated, prompt_tokens=evaluated),
        results=[backend_pb2.DocumentResult(index=i, text=documents[i], relevance_score=scores[i])
                 for i in order])


def model_metadata(lm) -> "backend_pb2.ModelMetadataResponse":
    """What the host needs to know of the model's chat format (prep thread)."""
    tok = lm.tokenizer
    # An encoder's tokenizer is transformers' own, without mlx-lm's chat attributes: none of them.
    out = backend_pb2.ModelMetadataResponse(supports_thinking=bool(getattr(tok, "has_thinking", False)))
    if lm.serves.media:  # a raw Prompt marks each image with it
        out.media_marker = prepare.MEDIA_MARKER
    if getattr(tok, "has_chat_template", False):
        bound = limits.of(lm)
        try:
            with bounded("ModelMetadata", bound.template_seconds, bound.template_output_bytes):
                out.rendered_template = tok.apply_chat_template(
                    [{"role": "user", "content": "Hello"}], add_generation_prompt=True, tokenize=False,
                    enable_thinking=True)
        except Exception as e:  # a template that needs more than one user turn
            log.warning("ModelMetadata: the chat template did not render: %s", e)
    markers = out.tool_format
    if getattr(tok, "has_thinking", False):
        markers.reasoning_start, markers.reasoning_end = tok.think_start, tok.think_end
    if getattr(tok, "has_tool_calling", False):
        markers.format_type = tok.tool_parser.__module__.rsplit(".", 1)[-1]
        markers.per_call_start, markers.per_call_end = tok.tool_call_start, tok.tool_call_end or ""
        if markers.format_type == "json_tools":
            markers.name_field, markers.args_field = "name", "arguments"
    return out
