"""Text generation for one loaded model: mlx-lm's BatchGenerator and the prefix cache.

The engine's kind of work for text: it admits a request (nearest cached
prefix, the request's own sampler and logits processors), runs one step of
the whole batch, and takes requests out, returning their KV cache when it is
whole. Engine thread only.
"""

import logging
from typing import Any, Callable, Dict, List, Optional, Tuple

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, StopSequences
from mlx_lm.models.cache import make_prompt_cache

from engine.lanes.batch import Capabilities, Response
from engine.lanes.sampling import SamplingParams, argmax as _argmax, request_sampling
from engine.prefix import snapshots
from engine.prefix.prompt_store import make_store

log = logging.getLogger("mlx-backend.text")


class First(Response):
    """The first token of a request the engine prefilled directly."""


class TextBatch:
    """The Batch (batch.py) of a text model."""
    capabilities = Capabilities(speculate=True, shares_prefix=True)

    def __init__(self, lm, *, max_sequences: int, prefill_batch_size: int, prefill_step_size: int,
                 prompt_cache_bytes: int, prompt_cache_entries: int, stream, prompt_cache_disk_bytes: int = 0,
                 backlog_step_size: int = 0):
        self.lm = lm
        self.gen = BatchGenerator(
            lm.model, completion_batch_size=max_sequences, prefill_batch_size=prefill_batch_size,
            prefill_step_size=prefill_step_size, stream=stream)
        # mlx-lm's LRUPromptCache, with a disk tier behind it when prompt_cache_disk_bytes > 0.
        self.cache = make_store(lm, prompt_cache_entries, prompt_cache_bytes, prompt_cache_disk_bytes)
        self.max_sequences, self.prefill_batch_size = max_sequences, prefill_batch_size
        self.prefill_step_size = prefill_step_size
        # Prompt tokens a prefilling request takes in one step while others wait for a place: the
        # generator hands its prompt batch that many, which still feeds them in passes of
        # prefill_step_size (the prompt batch keeps the size it was made with).
        self.backlog_step_size = backlog_step_size or prefill_step_size
        self._eos = StopSequences([(t,) for t in lm.tokenizer.eos_token_ids])
        self._no_stop = StopSequences([])
        # Boundary snapshots (engine.prefix.snapshots) only where the cache cannot be trimmed back.
        self.snapshots = snapshots.wanted(lm.model)
        self._snapping: Dict[int, int] = {}  # uid -> its prompt's length, while its prefill snapshots
        self._left: Dict[int, int] = {}  # uid -> prompt tokens still to prefill in chunks, until it decodes

    def admit(self, prompt: List[int], max_tokens: int, sampling: SamplingParams, extra: List[Any],
              ignore_eos: bool, on_error: Callable[[Exception], None],
              direct: bool = False, boundaries: Tuple[int, ...] = (), request=None) -> Tuple[int, int, Optional[First]]:
        """Insert one request: (its uid, prompt tokens served from the cache, its first token
        when it was computed here). Raises on failure, leaving the batch as it was.

        With `direct` (nothing else runs) an uncached rest of at most one prefill chunk is
        prefilled here and the first token sampled from its last logits: one forward pass to
        the first token, where the batch generator takes a pass for the prompt, one for its
        last token and waits on the next.

        When the model's cache cannot be trimmed, the prefill stops at `boundaries`
        (prompt positions) and at the prompt's end and keeps a snapshot there.
        """
        cache, rest = self._nearest(prompt)
        cached = len(prompt) - len(rest)
        at = snapshots.positions(boundaries, cached, len(prompt)) if self.snapshots else []
        sampler, processors = self._guarded(sampling, extra, on_error)
        first = None
        parts = snapshots.segments(rest, cached, at)
        if direct and len(rest) <= self.prefill_step_size:
            cache = cache if cache is not None else make_prompt_cache(self.lm.model)
            token, logprobs = self._prefill_and_sample(cache, parts, prompt, sampler, processors)
            eos = token in self.lm.tokenizer.eos_token_ids and not ignore_eos
            finish = "stop" if eos else "length" if max_tokens <= 1 else None
            first = First(-1, token, logprobs, finish, cache, list(prompt))
            if finish:  # done in one token: never enters the batch
                return -1, cached, first
            # The batch continues from the sampled token, as from a one-token prompt.
            parts, cached_tokens, max_tokens = [[token]], list(prompt), max_tokens - 1
        else:
            cached_tokens = prompt[:cached]
        # Each segment's end is a stop of the prefill (insert_segments): a snapshot there (step).
        (uid,) = self.gen.insert_segments(
            [parts], max_tokens=[max_tokens], caches=[cache], all_tokens=[cached_tokens],
            samplers=[sampler], logits_processors=[processors],
            stop_sequences=[self._no_stop if ignore_eos else self._eos])
        if first is not None:
            first.uid = uid
        else:
            self._left[uid] = sum(len(p) for p in parts) - 1  # the library feeds the last token alone
            if at:
                self._snapping[uid] = len(prompt)
        return uid, cached, first

    def _nearest(self, key: List[Any]) -> Tuple[Any, List[Any]]:
        return self.cache.nearest(self.lm.epoch, key)

    def _guarded(self, sampling: SamplingParams, extra: List[Any], on_error: Callable[[Exception], None]):
        return request_sampling(sampling, extra, len(self.lm.tokenizer), on_error)

    def _prefill_and_sample(self, cache, parts: List[List[int]], prompt: List[int], sampler, processors):
        """Prefill the uncached rest of `prompt` (cut into `parts`, a snapshot kept at the end
        of each but the last) and sample the first token from the last part's logits."""
        with mx.stream(self.gen.stream):
            done = len(prompt) - sum(len(p) for p in parts)
            for part in parts[:-1]:
                self.lm.model(mx.array([part]), cache=cache)
                mx.eval([c.state for c in cache])
                done += len(part)
                self._keep(prompt[:done], snapshots.copied(cache), len(prompt))
            logits = self.lm.model(mx.array([parts[-1]]), cache=cache)[:, -1, :]
            context = mx.array(prompt, dtype=mx.int32)
            for p in processors:
                logits = p(context, logits)
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            token = (sampler or _argmax)(logprobs)
            mx.eval(token, logprobs, [c.state for c in cache])
        return int(token.item()), logprobs[0]

    def step(self) -> list:
        """One decode step for every running request (and a prefill chunk for new ones)."""
        prompts, responses = self.gen.next()
        if self._left:
            for r in responses:  # its first token: it decodes
                self._left.pop(r.uid, None)
        for r in prompts:  # progress: (tokens prefilled, the prompt's tokens)
            if r.uid in self._left:
                self._left[r.uid] = 0 if r.end_of_prompt else r.progress[1] - r.progress[0] - 1
        if self._snapping:
            self._snapshot(prompts)
        return responses

    def _snapshot(self, prompts: list) -> None:
        """Keep a snapshot of each snapshotting request whose prefill just ended a segment."""
        ended = [r.uid for r in prompts if r.end_of_segment and not r.end_of_prompt and r.uid in self._snapping]
        for uid, (cache, tokens) in self.gen.extract_cache(ended).items():
            self._keep(list(tokens), snapshots.compact(cache), self._snapping[uid])
        for r in prompts:
            if r.end_of_prompt:
                self._snapping.pop(r.uid, None)

    def _keep(self, tokens: List[int], cache: List[Any], prompt_length: int) -> None:
        self.cache.keep_snapshot(self.lm.epoch, tokens, cache, prompt_length)

    def waiting(self, n: int) -> None:
        self.gen.prefill_step_size = self.backlog_step_size if n else self.prefill_step_size

    def prefill_left(self, uid: int) -> Optional[int]:
        return self._left.get(uid)

    def forget(self, uid: int) -> str:
        return ""

    def live_cache(self, uid: int) -> Optional[List[Any]]:
        """A running request's per-layer KV cache as it is now (views, left in the batch),
        for questions about its state; None when it is not in the batch."""
        return self.gen.extract_cache([uid]).get(uid, (None, None))[0]

    def remove(self, uids: List[int], keep_cache: bool = False) -> Dict[int, Tuple[Any, List[int]]]:
        """Take requests out of the batch; with keep_cache, {uid: (KV cache, its tokens)}."""
        for uid in uids:
            self._snapping.pop(uid, None)
            self._left.pop(uid, None)
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
        self.cache.insert_cache(self.lm.epoch, list(tokens), snapshots.compact(cache))

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
