"""The solo lane: one request at a time through mlx-lm's own generation step.

A model whose caches mlx-lm's batch cannot merge, or whose batched text differs from its
own single stream (engine/lane_choice.py decides at load), runs here: each request alone
through `mlx_lm.generate.generate_step`, with its own sampler, logits processors and
prompt cache, so its text is the library's own. The scheduler drives it as any Batch; its
Capabilities say one request runs at a time, so the others wait in the scheduler's queue,
in arrival order, under the same bounds. Each step is one bounded piece of work: a chunk of
the prompt's prefill, then one token, so Health, cancellation and the queue are served
between tokens.

The prefix cache serves it where the cache kind allows (prefix/kinds.py): the nearest
cached prefix is fetched and cut back as the text batch does, the prefill stops at the
same boundaries to keep snapshots of caches that cannot be cut back, and a finished
request's cache is kept for later prompts. Engine thread only.
"""

import itertools
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from engine.lanes.batch import Capabilities, Failed, Response
from engine.lanes.sampling import SamplingParams, request_sampling
from engine.prefix import kinds, snapshots
from engine.prefix.prompt_store import make_store

log = logging.getLogger("mlx-backend.solo")


@dataclass
class _Run:
    """The one request running, from its prefill to its last token."""
    uid: int
    prompt: List[int]
    cache: List[Any]
    pieces: List[List[int]]  # prefill chunks still to run, ending one token short of the prompt
    done: int  # prompt tokens the cache holds
    snap_at: List[int]  # prompt positions to keep a snapshot at
    max_tokens: int
    ignore_eos: bool
    sampler: Any
    processors: List[Any]
    media: Any = None
    steps: Optional[Iterator] = None  # the library's generation step, once the prefill is done
    generated: List[int] = field(default_factory=list)


class SoloBatch:
    """The Batch (batch.py) of the solo lane for a text model."""
    capabilities = Capabilities(shares_prefix=True, max_running=1)

    def __init__(self, lm, *, prefill_step_size: int, prompt_cache_bytes: int, prompt_cache_entries: int,
                 stream, prompt_cache_disk_bytes: int = 0, **_batch_sizes):
        self.lm = lm
        self.stream = stream
        self.prefill_step_size = prefill_step_size
        # mlx-lm's LRUPromptCache (with the disk tier), or None: Score's passes then keep nothing either.
        self.cache = self._store(prompt_cache_entries, prompt_cache_bytes, prompt_cache_disk_bytes)
        self.snapshots = self.cache is not None and snapshots.wanted(lm.model)
        self._run: Optional[_Run] = None
        self._uids = itertools.count()

    def _store(self, entries: int, max_bytes: int, disk_bytes: int):
        unserved = kinds.unserved(make_prompt_cache(self.lm.model))
        if unserved:
            log.info("solo lane: no prefix cache (its %s layers cannot be cut back exactly)", unserved)
            return None
        return make_store(self.lm, entries, max_bytes, disk_bytes)

    # ---- a request in ---------------------------------------------------------------

    def admit(self, prompt: List[int], max_tokens: int, sampling: SamplingParams, extra: List[Any],
              ignore_eos: bool, on_error: Callable[[Exception], None], direct: bool = False,
              boundaries: Tuple[int, ...] = (), request=None, media=None) -> Tuple[int, int, None]:
        """Take the one request this lane runs: (its uid, prompt tokens served from the cache,
        None: its tokens come from the steps). `direct` changes nothing: it always runs alone."""
        if self._run is not None:  # the scheduler admits no more than capabilities.max_running
            raise RuntimeError("the solo lane already runs a request")
        cache, rest = self.cache.nearest(self.lm.epoch, prompt) if self.cache is not None else (None, prompt)
        cached = len(prompt) - len(rest)
        at = snapshots.positions(boundaries, cached, len(prompt)) if self.snapshots else []
        sampler, processors = request_sampling(sampling, extra, len(self.lm.tokenizer), on_error)
        self._run = _Run(
            uid=next(self._uids), prompt=list(prompt), cache=cache if cache is not None else self._new_cache(),
            pieces=self._pieces(rest[:-1], cached, at), done=cached, snap_at=at, max_tokens=max_tokens,
            ignore_eos=ignore_eos, sampler=sampler, processors=processors, media=media)
        return self._run.uid, cached, None

    def _new_cache(self) -> List[Any]:
        return make_prompt_cache(self.lm.model)

    def _pieces(self, body: List[int], start: int, at: List[int]) -> List[List[int]]:
        """The prefill of `body` (the prompt from `start` on, but its last token) in chunks of
        at most prefill_step_size, each ending at the snapshot positions `at` it passes."""
        out = []
        for segment in snapshots.segments(body, start, [p for p in at if p < start + len(body)]):
            out += [segment[i:i + self.prefill_step_size] for i in range(0, len(segment), self.prefill_step_size)]
        return out

    # ---- one step: a prefill chunk or one token ---------------------------------------

    def step(self) -> List[Any]:
        run = self._run
        if run is None:
            return []
        try:
            with mx.stream(self.stream):
                if run.pieces:
                    self._prefill(run, run.pieces.pop(0))
                    return []
                if run.steps is None:
                    run.steps = self._steps(run)
                token, logprobs = next(run.steps)
        except Exception as e:  # the one request running fails with what the library raised; the lane goes on
            self._run = None
            return [Failed(run.uid, "generation step", e)]
        run.generated.append(token)
        eos = token in self.lm.tokenizer.eos_token_ids and not run.ignore_eos
        finish = "stop" if eos else "length" if len(run.generated) >= run.max_tokens else None
        if finish is None:
            return [Response(run.uid, token, logprobs, None, None, None)]
        self._run = None
        return [Response(run.uid, token, logprobs, finish, run.cache, run.prompt + run.generated)]

    def _prefill(self, run: _Run, piece: List[int]) -> None:
        """One chunk into the cache, as generate_step's own prefill runs it; a snapshot where one is due."""
        self.lm.model(mx.array([piece]), cache=run.cache)
        mx.eval([c.state for c in run.cache])
        run.done += len(piece)
        if run.done in run.snap_at:
            self.cache.keep_snapshot(self.lm.epoch, run.prompt[:run.done], snapshots.copied(run.cache),
                                     len(run.prompt))

    def _steps(self, run: _Run) -> Iterator[Tuple[int, Any]]:
        """mlx-lm's own generation step from the prompt's last token over the filled cache.

        Its logits processors see the tokens it was given; the ones prefilled before it come
        first in their context, so a penalty or a grammar sees the whole prompt as it would
        had generate_step prefilled it itself.
        """
        from mlx_lm.generate import generate_step

        before = mx.array(run.prompt[:run.done])
        processors = [_with_context(p, before) for p in run.processors] if run.done else run.processors
        return generate_step(
            mx.array(run.prompt[run.done:]), self.lm.model, self.stream, max_tokens=run.max_tokens,
            sampler=run.sampler, logits_processors=processors, prompt_cache=run.cache,
            prefill_step_size=self.prefill_step_size)

    # ---- requests out -------------------------------------------------------------------

    def waiting(self, n: int) -> None:
        pass  # company changes nothing: the next request starts when this one ends

    def remove(self, uids: List[int], keep_cache: bool = False) -> Dict[int, Tuple[Any, List[int]]]:
        """Take the running request out; with keep_cache, its cache once it has generated (the
        generation step has fed every token it returned: the cache holds prompt + generated)."""
        run = self._run
        if run is None or run.uid not in uids:
            return {}
        self._run = None
        if keep_cache and run.generated:
            return {run.uid: (run.cache, run.prompt + run.generated)}
        return {}

    def prefill_left(self, uid: int) -> Optional[int]:
        return None  # one request at a time: no other prefill shares its steps

    def forget(self, uid: int) -> str:
        return ""

    def save(self, tokens: Optional[List[int]], cache: Optional[Any]) -> None:
        """Keep a finished request's cache for later prompts, as a compact copy (text_batch.save)."""
        if self.cache is None or cache is None or not tokens:
            return
        self.cache.insert_cache(self.lm.epoch, list(tokens), snapshots.compact(cache))

    @property
    def cache_bytes(self) -> int:
        return self.cache.nbytes if self.cache is not None else 0

    def cache_figures(self) -> dict:
        return self.cache.figures() if self.cache is not None else {}

    def close(self) -> None:
        self._run = None
        if self.cache is None:
            return
        try:  # what memory still holds is warm: kept on disk for the next batch, or process
            self.cache.flush_to_disk()
        except Exception:
            log.exception("keeping the prompt cache on disk failed")


def _with_context(processor: Callable, before) -> Callable:
    """`processor` seeing the prefilled prompt tokens `before` ahead of the tokens it is given."""
    def call(tokens, logits):
        return processor(mx.concatenate([before, tokens.astype(before.dtype)]), logits)

    return call
