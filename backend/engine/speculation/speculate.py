"""Speculative decoding of a request that runs alone (engine thread only).

One decode step of a lone stream reads every weight to produce one token; a
step over [last token + k proposed tokens] reads them once for up to k + 1.
The speculating batch (spec_batch.py) hands a request here when it runs alone: its KV cache
comes out of the batch, proposals come from prompt lookup (ngram.py) or a
draft model, and one forward pass of the model checks them all. When another
request arrives the stream goes back into the batch with its cache (`rejoin`),
so batching is never slower than without speculation.

Exactness: at every position the request's own sampler draws a token from the
model's distribution given the proposed prefix; proposals are accepted while
they equal those draws, and the first differing draw is emitted. Every emitted
token is therefore a draw from the model given the actual text before it:
greedy output is the argmax sequence, sampled output follows the same
distribution (for a proposal fixed before the draw, P(accept d) = p(d) and a
rejection leaves p without d: the standard rejection rule). As the sampler's
key depends on the token's position alone, these are even the very draws
plain decoding makes: the same seed gives the same text with or without
speculation. Requests with logits processors (penalties, logit bias,
grammar) keep decoding in the batch.
"""

import logging
from dataclasses import dataclass
from typing import Any, Callable, List, Optional

import mlx.core as mx
from mlx_lm.generate import StopSequences
from mlx_lm.models.cache import CacheList, make_prompt_cache, trim_prompt_cache

from engine.lanes.sampling import make_processors, make_sampler
from engine.kv.rewind import can_rewind, draft_room
from engine.speculation.ngram import NgramIndex
from engine.speculation.spec_config import Settings, settings_of  # noqa: F401 (spec_batch reads settings here)

log = logging.getLogger("mlx-backend.speculate")

IDLE_STEPS = 3  # passes in a row without an accepted draft before the stream goes back to the batch
MAX_PAUSE = 64  # tokens decoded in the batch before trying again, at most


@dataclass
class Track:
    """One request's speculation across its turns out of the batch (kept by spec_batch with the request)."""
    proposed: int = 0
    accepted: int = 0
    resume_at: int = 0  # generated tokens before speculation is tried again
    pauses: int = 0
    draft_cache: Any = None  # the draft model's KV cache, kept so a new turn only catches up

    @classmethod
    def never(cls) -> "Track":
        return cls(resume_at=1 << 62)

    def ready(self, generated: int) -> bool:
        return generated >= self.resume_at

    def summary(self) -> str:
        return f", drafts accepted {self.accepted}/{self.proposed}" if self.proposed else ""


@dataclass
class Response:
    """One token, shaped like a BatchGenerator response for the engine."""
    uid: int
    token: int
    logprobs: Any
    finish_reason: Optional[str] = None
    prompt_cache: Any = None
    all_tokens: Optional[List[int]] = None


def draft_length(settings: Settings, request) -> int:
    """Tokens to propose per step for this request; 0: it decodes in the batch."""
    n = settings.n_draft if request.n_draft is None else request.n_draft
    if settings.mode == "off" or n <= 0:
        return 0
    if make_processors(request.sampling, request.processors):
        return 0  # processors see one history per call; the batch keeps it exact
    return n


def can_start(cache) -> bool:
    """Whether a request whose live cache is `cache` can speculate at all now: one
    draft in a pass must be removable. When it cannot, it never will (offsets only
    grow): a recurrent state, or a window that is full or about to be."""
    return cache is not None and can_rewind(cache, 1, grow=2)


def verify(logprobs: mx.array, drafts: List[int], sampler: Optional[Callable]) -> List[int]:
    """The tokens to emit after one verification pass: accepted drafts, then one draw.

    `logprobs[i]` is the model's distribution after the prefix + drafts[:i]
    (k + 1 rows for k drafts). Row i is drawn with the request's sampler at
    its own position (its own key), as plain decoding would draw that token.
    """
    if sampler is None:
        draws = mx.argmax(logprobs, axis=-1)
    else:
        start = sampler.position
        draws = mx.concatenate([sampler(logprobs[i:i + 1]).reshape(-1) for i in range(logprobs.shape[0])])
    draws = draws.tolist()
    n = 0
    while n < len(drafts) and draws[n] == drafts[n]:
        n += 1
    if sampler is not None:  # the positions past the first rejection were never emitted
        sampler.position = start + n + 1
    return drafts[:n] + [draws[n]]


def _offset(cache) -> int:
    c = cache[0]
    while isinstance(c, CacheList):
        c = c.caches[0]
    return c.offset


def _rewind(cache, n: int) -> None:
    """Drop the newest `n` tokens; callers checked `can_rewind`, so a shortfall is a bug
    (trim_prompt_cache trims nothing, silently, when a layer refuses)."""
    if n and trim_prompt_cache(cache, n) != n:
        raise RuntimeError(f"the KV cache refused to drop {n} tokens")


def _sync(model, cache, tokens: List[int], chunk: int = 512) -> None:
    """Make `cache` hold exactly `tokens` (a prefix of them already there)."""
    have = _offset(cache)
    if have > len(tokens):
        if can_rewind(cache, have - len(tokens)):
            _rewind(cache, have - len(tokens))
            have = len(tokens)
        else:  # a draft model's wrapped window: recomputed from the start
            cache[:] = make_prompt_cache(model)
            have = 0
    while have < len(tokens):
        part = tokens[have:have + chunk]
        model(mx.array([part]), cache=cache)
        mx.eval([c.state for c in cache])
        have += len(part)


class Solo:
    """One request decoding alone with speculation; holds its KV cache meanwhile.

    Invariant between steps: the cache holds context[:-1]; context[-1] is the
    last emitted token, the first input of the next pass.
    """

    def __init__(self, lm, settings: Settings, slot, cache, context: List[int], max_tokens: int,
                 n_draft: int, stream):
        req = slot.request
        self.slot, self.uid = slot, slot.uid
        self.model, self.stream = lm.model, stream
        self.cache = cache if cache is not None else make_prompt_cache(lm.model)
        self.context = list(context)
        self.remaining = max_tokens
        self.eos = set() if req.ignore_eos else set(lm.tokenizer.eos_token_ids)
        # Keys follow the position in the completion: the draws the batch would have made.
        self.sampler = make_sampler(req.sampling, len(lm.tokenizer), position=len(context) - len(req.prompt))
        self.k_max = self.k = n_draft
        self.idle = 0
        self.wants_batch = False  # drafts keep failing: plain decoding is faster in the batch
        if slot.spec is None:
            slot.spec = Track()
        self.track = slot.spec
        self.passes = 0
        self.draft = settings.draft if settings.mode == "draft" else None
        if self.draft is not None:
            if self.track.draft_cache is None:
                self.track.draft_cache = make_prompt_cache(self.draft.model)
            self.draft_cache = self.track.draft_cache
            self.index = None
        else:
            self.index = NgramIndex(self.context, settings.ngram_max, settings.ngram_min)
        with mx.stream(stream):
            _sync(self.model, self.cache, self.context[:-1])

    # ---- proposing ------------------------------------------------------------

    def _length(self) -> int:
        """Drafts for this pass: as many as the live cache can take back (a window must
        not wrap while rejected drafts are in it). None fit: back to the batch for good."""
        want = max(0, min(self.k, self.remaining - 1))
        room = draft_room(self.cache, want)
        if want and not room and self.remaining > 1:
            self.wants_batch = True
            self.track.resume_at = Track.never().resume_at
        return room

    def _propose(self, k: int) -> List[int]:
        if k <= 0:
            return []
        if self.index is not None:
            return self.index.propose(k)
        # The draft model catches up with the context, then proposes greedily.
        d = self.draft.model
        _sync(d, self.draft_cache, self.context[:-1])
        y = mx.array([self.context[-1:]])
        out = []
        for i in range(k):
            logits = d(y, cache=self.draft_cache)[:, -1, :]
            y = mx.argmax(logits, axis=-1, keepdims=True)
            out.append(y)
            mx.async_eval(y)
        # The draft cache now holds context + drafts[:-1]; rejected ones are trimmed after the check.
        return mx.concatenate(out, axis=1)[0].tolist()

    def _adapt(self, proposed: int, accepted: int) -> None:
        """Longer drafts while they pass, shorter after a miss; back to the batch after repeated misses."""
        self.track.proposed += proposed
        self.track.accepted += accepted
        if proposed:
            self.k = min(self.k_max, self.k * 2) if accepted == proposed else max(1, accepted + 1)
        self.idle = 0 if accepted else self.idle + 1
        if self.idle >= IDLE_STEPS and self.remaining > 0:
            self.wants_batch = True
            t = self.track
            t.resume_at = len(self.context) - len(self.slot.request.prompt) + min(MAX_PAUSE, 4 << t.pauses)
            t.pauses += 1

    # ---- one step ---------------------------------------------------------------

    def step(self):
        """Yield this step's tokens one by one (the engine may stop consuming at any one)."""
        with mx.stream(self.stream):
            drafts = self._propose(self._length())
            k = len(drafts)
            logits = self.model(mx.array([self.context[-1:] + drafts]), cache=self.cache)[0]
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            tokens = verify(logprobs, drafts, self.sampler)
        self.passes += 1
        accepted = len(tokens) - 1
        # The cache holds context + drafts: keep context + the accepted ones.
        _rewind(self.cache, k - accepted)
        if self.draft is not None and k:
            # The draft cache holds context[:-1] + [last] + drafts[:-1].
            keep = min(accepted, k - 1)
            trim_prompt_cache(self.draft_cache, (k - 1) - keep)
        self._adapt(k, accepted)
        for i, token in enumerate(tokens):
            self.context.append(token)
            if self.index is not None:
                self.index.extend([token])
            self.remaining -= 1
            finish = "stop" if token in self.eos else "length" if self.remaining <= 0 else None
            if finish:
                cache, all_tokens = self.release()
                yield Response(self.uid, token, logprobs[i], finish, cache, all_tokens)
                return
            yield Response(self.uid, token, logprobs[i])

    # ---- leaving ------------------------------------------------------------------

    def release(self):
        """(KV cache, the tokens it holds): what the engine keeps in the prefix cache;
        (None, None) when the cache cannot be brought back to the emitted tokens."""
        held = _offset(self.cache)
        if held > len(self.context):
            if not can_rewind(self.cache, held - len(self.context)):
                return None, None
            _rewind(self.cache, held - len(self.context))
            held = len(self.context)
        log.debug("request %d: %d speculative passes so far", self.slot.request.id, self.passes)
        return self.cache, self.context[:held]

    def rejoin(self, gen, on_error: Callable[[Exception], None]) -> int:
        """Back into the batch generator from where it is; its new uid there."""
        from engine.lanes.sampling import argmax as _argmax, guarded

        cache, held = self.release()
        if cache is None:
            raise RuntimeError("the KV cache cannot rejoin the batch")
        pending = self.context[len(held):]
        if not pending:  # the last token is in the cache: recompute it for its logits
            _rewind(cache, 1)
            held, pending = held[:-1], held[-1:]
        sampler = guarded(self.sampler, _argmax, on_error) if self.sampler else None
        (uid,) = gen.insert([pending], max_tokens=[self.remaining], caches=[cache], all_tokens=[held],
                            samplers=[sampler], logits_processors=[[]],
                            stop_sequences=[StopSequences([(t,) for t in sorted(self.eos)])])
        return uid
