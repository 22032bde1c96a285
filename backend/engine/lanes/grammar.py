"""Grammar-constrained decoding with llguidance.

A request's grammar (GBNF or Lark in `Grammar`, a JSON schema in Metadata
`json_schema` or `response_format`) is compiled on the preparation thread, so
a bad grammar is INVALID_ARGUMENT before any token is generated. Decoding
then masks the logits with the matcher's token bitmask at every step.
llguidance's own mlx helper uses a Metal kernel; the mask is applied here
with plain mx operations so the CPU and CUDA work too.
"""

import json
import logging
import threading
from typing import Dict, Optional, Tuple

import numpy as np

from common.python_utils import JSON_DEPTH, OptionError, parse_json_field
from engine.lanes.sampling import RequestFailure

log = logging.getLogger("mlx-backend.grammar")

_lock = threading.Lock()


def _ll_tokenizer(lm):
    """llguidance's view of the model's tokenizer: ~1 s to build, kept in that model's memo (a
    cache of what its tokenizer determines: loaders/loaded.py Memo)."""
    import llguidance.hf

    def build():
        hf = lm.tokenizer._tokenizer
        n_vocab = int(lm.config.get("vocab_size") or len(hf))
        return llguidance.hf.from_tokenizer(hf, n_vocab=max(n_vocab, len(hf)),
                                            eos_token=sorted(lm.tokenizer.eos_token_ids))

    with _lock:  # preparation threads race for it: built once
        return lm.memo.get("llguidance", build)


def grammar_source(grammar: str, metadata: Dict[str, str],
                   max_depth: int = JSON_DEPTH) -> Optional[Tuple[str, str]]:
    """(llguidance grammar, the field it came from) for a request, or None."""
    from llguidance import grammar_from

    if grammar.strip():
        try:
            return grammar_from("gbnf", grammar), "Grammar"  # also takes Lark
        except ValueError as e:
            raise OptionError(f"Grammar: {e}") from None
    schema, field = None, "Metadata.json_schema"
    if metadata.get("json_schema", "").strip():
        schema = parse_json_field("Metadata.json_schema", metadata["json_schema"], dict, max_depth)
    elif metadata.get("response_format", "").strip():
        field = "Metadata.response_format"
        fmt = parse_json_field(field, metadata["response_format"], dict, max_depth)
        kind = fmt.get("type")
        if kind == "json_schema":
            inner = fmt.get("json_schema") or {}
            schema = inner.get("schema", inner) if isinstance(inner, dict) else None
            if not isinstance(schema, dict):
                raise OptionError("Metadata.response_format: json_schema.schema must be an object")
        elif kind == "json_object":
            schema = {"type": "object"}
        elif kind not in (None, "text"):
            raise OptionError(f"Metadata.response_format: unknown type {kind!r}")
    if schema is None:
        return None
    from llguidance import LLMatcher

    try:
        return LLMatcher.grammar_from_json_schema(json.dumps(schema)), field
    except Exception as e:  # the compiler's own message says what is wrong
        raise OptionError(f"{field}: {e}") from None


class GrammarProcessor:
    """An mlx-lm logits processor that keeps one request inside its grammar.

    If the matcher fails, the request fails: text generated without its
    constraint must never be returned as if it had been constrained.
    """

    def __init__(self, matcher, vocab_size: int):
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.calls = 0
        self.fault_at = -1  # tests only (faults.grammar): feed the matcher a token it forbids at this step

    def __call__(self, tokens, logits):
        from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

        if self.calls > 0:
            # The last context token is the one sampled at the previous step.
            token = int(tokens[-1].item())
            if self.calls == self.fault_at:
                token = self._forbidden()
            self.matcher.consume_token(token)
        self.calls += 1
        if self.matcher.is_error():
            raise RequestFailure(f"the grammar failed after {self.calls - 1} tokens: {self.matcher.get_error()}")
        bits = allocate_token_bitmask(1, self.vocab_size)
        fill_next_token_bitmask(self.matcher, bits)
        return apply_bitmask(logits, bits)

    def _forbidden(self) -> int:
        from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

        bits = allocate_token_bitmask(1, self.vocab_size)
        fill_next_token_bitmask(self.matcher, bits)
        allowed = np.unpackbits(bits.view(np.uint8), bitorder="little")[: self.vocab_size]
        return int(np.flatnonzero(allowed == 0)[0])


def apply_bitmask(logits, bits: np.ndarray):
    """-inf wherever the int32 bitmask (bit i of word i // 32) is 0; ids past it too."""
    import mlx.core as mx

    vocab = logits.shape[-1]
    allowed = np.unpackbits(np.ascontiguousarray(bits).view(np.uint8), axis=-1, bitorder="little")
    allowed = allowed[..., :vocab].astype(bool)
    if allowed.shape[-1] < vocab:
        pad = [(0, 0)] * (allowed.ndim - 1) + [(0, vocab - allowed.shape[-1])]
        allowed = np.pad(allowed, pad)
    return mx.where(mx.array(allowed), logits, mx.array(-mx.inf, dtype=logits.dtype))


def compile_processor(lm, source: str, field: str = "Grammar") -> GrammarProcessor:
    """A fresh matcher for one request; OptionError naming `field` if invalid."""
    from llguidance import LLMatcher

    tok = _ll_tokenizer(lm)
    matcher = LLMatcher(tok, source, log_level=0)
    if matcher.is_error():
        raise OptionError(f"{field}: {matcher.get_error()}")
    vocab = int(lm.config.get("vocab_size") or len(lm.tokenizer))
    return GrammarProcessor(matcher, max(vocab, tok.vocab_size))
