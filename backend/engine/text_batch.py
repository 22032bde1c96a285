"""Text generation for one loaded model: mlx-lm's BatchGenerator and the prefix cache.

The engine's kind of work for text: it admits a request (nearest cached
prefix, the request's own sampler and logits processors), runs one step of
the whole batch, and takes requests out, returning their KV cache when it is
whole. Engine thread only.
"""

import logging
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.generate import BatchGenerator, StopSequences
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from engine.prompt_store import make_store
from engine.sampling import SamplingParams, make_processors, make_sampler

log = logging.getLogger("mlx-backend.text")


def _argmax(logprobs):
    return logprobs.argmax(axis=-1)


def _unchanged(tokens, logits):
    return logits


def guarded(fn: Callable, fallback: Callable, on_error: Callable[[Exception], None]) -> Callable:
    """A request's own sampler or logits processor that fails that request alone.

    After the first error the batch keeps decoding that row with `fallback`
    until the engine takes the request out at the end of the step.
    """
    failed = False

    def call(*args):
        nonlocal failed
        if not failed:
            try:
                return fn(*args)
            except Exception as e:
                failed = True
                on_error(e)
        return fallback(*args)

    return call


@dataclass
class First:
    """The first token of a request the engine prefilled directly (shaped like a batch response)."""
    uid: int
    token: int
    logprobs: Any
    finish_reason: Optional[str]
    prompt_cache: Any
    all_tokens: Optional[List[int]]


class TextBatch:
    def __init__(self, lm, *, max_sequences: int, prefill_batch_size: int, prefill_step_size: int,
                 prompt_cache_bytes: int, prompt_cache_entries: int, stream, prompt_cache_disk_bytes: int = 0):
        self.lm = lm
        self.gen = BatchGenerator(
            lm.model, completion_batch_size=max_sequences, prefill_batch_size=prefill_batch_size,
            prefill_step_size=prefill_step_size, stream=stream)
        # mlx-lm's LRUPromptCache, with a disk tier behind it when prompt_cache_disk_bytes > 0.
        self.cache = make_store(lm, prompt_cache_entries, prompt_cache_bytes, prompt_cache_disk_bytes)
        self.prefill_step_size = prefill_step_size
        self._eos = StopSequences([(t,) for t in lm.tokenizer.eos_token_ids])
        self._no_stop = StopSequences([])

    def admit(self, prompt: List[int], max_tokens: int, sampling: SamplingParams, extra: List[Any],
              ignore_eos: bool, on_error: Callable[[Exception], None],
              direct: bool = False) -> Tuple[int, int, Optional[First]]:
        """Insert one request: (its uid, prompt tokens served from the cache, its first token
        when it was computed here). Raises on failure, leaving the batch as it was.

        With `direct` (nothing else runs) an uncached rest of at most one prefill chunk is
        prefilled here and the first token sampled from its last logits: one forward pass to
        the first token, where the batch generator takes a pass for the prompt, one for its
        last token and waits on the next.
        """
        cache, rest = self._nearest(prompt)
        cached = len(prompt) - len(rest)
        sampler, processors = self._guarded(sampling, extra, on_error)
        first = None
        if direct and len(rest) <= self.prefill_step_size:
            cache = cache if cache is not None else make_prompt_cache(self.lm.model)
            token, logprobs = self._prefill_and_sample(cache, rest, prompt, sampler, processors)
            eos = token in self.lm.tokenizer.eos_token_ids and not ignore_eos
            finish = "stop" if eos else "length" if max_tokens <= 1 else None
            first = First(-1, token, logprobs, finish, cache, list(prompt))
            if finish:  # done in one token: never enters the batch
                return -1, cached, first
            # The batch continues from the sampled token, as from a one-token prompt.
            rest, cached_tokens, max_tokens = [token], list(prompt), max_tokens - 1
        else:
            cached_tokens = prompt[:cached]
        (uid,) = self.gen.insert(
            [rest], max_tokens=[max_tokens], caches=[cache], all_tokens=[cached_tokens],
            samplers=[sampler], logits_processors=[processors],
            stop_sequences=[self._no_stop if ignore_eos else self._eos])
        if first is not None:
            first.uid = uid
        return uid, cached, first

    def _nearest(self, key: List[Any]) -> Tuple[Any, List[Any]]:
        """The longest cached prefix of `key` and the rest to prefill (at least one token,
        for the logits: a wholly cached prompt recomputes its last token)."""
        cache, rest = self.cache.fetch_nearest_cache(self.lm.epoch, key)
        if cache is not None and not rest:
            if can_trim_prompt_cache(cache):
                trim_prompt_cache(cache, 1)
                rest = key[-1:]
            else:
                cache, rest = None, key
        return cache, rest

    def _guarded(self, sampling: SamplingParams, extra: List[Any], on_error: Callable[[Exception], None]):
        """The request's own sampler (None: greedy) and logits processors, each failing it alone."""
        sampler = make_sampler(sampling, len(self.lm.tokenizer))
        return (guarded(sampler, _argmax, on_error) if sampler else None,
                [guarded(p, _unchanged, on_error) for p in make_processors(sampling, extra)])

    def _prefill_and_sample(self, cache, rest: List[int], prompt: List[int], sampler, processors):
        with mx.stream(self.gen.stream):
            logits = self.lm.model(mx.array([rest]), cache=cache)[:, -1, :]
            context = mx.array(prompt, dtype=mx.int32)
            for p in processors:
                logits = p(context, logits)
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            token = (sampler or _argmax)(logprobs)
            mx.eval(token, logprobs, [c.state for c in cache])
        return int(token.item()), logprobs[0]

    def step(self) -> list:
        """One decode step for every running request (and a prefill chunk for new ones)."""
        _, responses = self.gen.next()
        return responses

    def live_cache(self, uid: int) -> Optional[List[Any]]:
        """A running request's per-layer KV cache as it is now (views, left in the batch),
        for questions about its state; None when it is not in the batch."""
        return self.gen.extract_cache([uid]).get(uid, (None, None))[0]

    def remove(self, uids: List[int], keep_cache: bool = False) -> Dict[int, Tuple[Any, List[int]]]:
        """Take requests out of the batch; with keep_cache, {uid: (KV cache, its tokens)}."""
        return self.gen.remove(uids, return_prompt_caches=keep_cache)

    def save(self, tokens: Optional[List[int]], cache: Optional[Any]) -> None:
        """Keep a finished request's KV cache for later prompts sharing its prefix.

        What the batch hands back are views into the whole batch's KV buffers:
        kept as they are, they would pin those buffers (far more than the bytes the
        prefix cache counts) and measurably slow the prefills that follow. Kept as
        compact copies instead.
        """
        if cache is None or not tokens:
            return
        for layer in cache:  # tree_map: a quantized cache's state nests (packed, scales, biases)
            layer.state = tree_map(lambda a: mx.array(a) if isinstance(a, mx.array) else a, layer.state)
        mx.eval([layer.state for layer in cache])
        self.cache.insert_cache(self.lm.epoch, list(tokens), cache)

    @property
    def cache_bytes(self) -> int:
        return self.cache.nbytes

    def cache_figures(self) -> dict:
        return self.cache.figures()

    def close(self) -> None:
        try:  # what memory still holds is warm: kept on disk for the next batch, or process
            self.cache.flush_to_disk()
        except Exception:
            log.exception("keeping the prompt cache on disk failed")
        try:
            self.gen.close()
        except Exception:
            log.exception("closing the batch generator failed")
