"""Forward-only work on the engine thread: embeddings and candidate scores.

No sampling, no decode loop: a forward pass over given tokens, read out as
pooled hidden states (Embedding) or as log-probabilities of given tokens
(Score, and Rerank on a causal LM). The engine runs one bounded chunk of it
between two decode steps, so running streams stall at most one chunk:
- embedding jobs waiting together are padded into one batch (up to the token
  budget), whichever call they came from;
- a score job prefills its shared prompt in chunks (from the prefix cache
  when it is warm; hidden states only), then evaluates its candidates in
  batches sized by what they allocate, each row continuing a copy of the
  prompt's KV in the cache's own form, logits only at the rows' positions;
  for a model whose output depends on how a sequence is split between passes
  (split_check.py), each row is the prompt and the candidate in one pass.
Engine thread only (every MLX call); jobs are built by forward_prep.
"""

import dataclasses
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, List, Optional

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from engine.forward import pair_forward
from engine.forward.row_batch import run_rows, take_rows
from engine.forward.score_rows import rows_end, save, score_rows, warm_cache
from engine.forward.split_check import split_sensitive
from engine.prefix import kinds, snapshots

log = logging.getLogger("mlx-backend.forward")

@dataclass
class EmbedJob:
    inputs: List[List[int]]  # token ids, one list per text
    pooling: str  # mean | cls | last | none (one vector per token)
    normalize: bool
    model_epoch: int = 0
    label: str = ""
    cancelled: bool = False  # set by Engine.cancel(id) when its call ends; it then leaves the queue
    id: int = 0  # given by Engine.forward


@dataclass
class EmbedResult:
    vectors: List[List[List[float]]]  # per input: one vector, or one per token with pooling none
    prompt_tokens: int


@dataclass
class ScoreJob:
    """Candidates continuing one prompt. `shared` is the prompt's KV part, common to every
    row; row i's inputs continue it and predict `targets[i]`, of which those from
    `first[i]` on belong to the candidate (earlier ones re-read the prompt's own tail)."""
    shared: List[int]
    rows: List[List[int]]
    targets: List[List[int]]
    first: List[int]
    save_upto: int  # tokens of `shared` kept in the prefix cache afterwards
    model_epoch: int = 0
    label: str = ""
    cancelled: bool = False  # as EmbedJob.cancelled
    id: int = 0


@dataclass
class ScoreResult:
    tokens: List[List[int]]  # per candidate: its token ids
    logprobs: List[List[float]]  # per candidate: log P(token | everything before it)
    prompt_tokens: int  # tokens evaluated for this job (cached ones not included)
    cached_tokens: int


class Cancelled(Exception):
    """The job's caller went away before it was done."""


@dataclass
class _Pending:
    job: Any
    sink: Any
    t_arrived: float
    done: int = 0  # how far it got: a score's prompt tokens, an embedding's inputs or tokens
    cache: Any = None
    cached: int = 0
    started: bool = False
    rows_done: int = 0
    snapshot: Any = None  # a score's cache at its save_upto, when its cache cannot be trimmed
    plain: bool = False  # each row runs the prompt anew: its cache cannot be copied per row, or `whole`
    whole: bool = False  # the model's output depends on the split: prompt and row in one pass
    pooled: Any = None  # vectors so far; for a long input, its running sum / last state / states
    out_tokens: List[List[int]] = field(default_factory=list)
    out_logprobs: List[List[float]] = field(default_factory=list)


class ForwardWork:
    """The queue of forward jobs and how one chunk of it runs."""

    def __init__(self):
        self.queue: Deque[_Pending] = deque()

    @property
    def pending(self) -> bool:
        return bool(self.queue)

    def first_arrival(self) -> Optional[float]:
        """When the oldest queued job arrived (the engine may hold it for others: Engine._hold)."""
        return self.queue[0].t_arrived if self.queue else None

    def add(self, job, sink) -> None:
        self.queue.append(_Pending(job, sink, time.perf_counter()))

    def cancel(self, job_id: int) -> bool:
        """Mark a queued job cancelled (it leaves at the next chunk); whether it was here."""
        for p in self.queue:
            if p.job.id == job_id:
                p.job.cancelled = True
                return True
        return False

    def drop_all(self) -> List[tuple]:
        """Every queued job, as (sink, job) pairs, out of the queue."""
        items = [(p.sink, p.job) for p in self.queue]
        self.queue.clear()
        return items

    def run_chunk(self, lm, budget: int, prefix_cache: Callable[[], Any], stream) -> List[tuple]:
        """One bounded piece of work; the (sink, result) of every job it completed.

        A failure fails the jobs of this chunk only (returned as (sink, exception) pairs).
        """
        gone = [p for p in self.queue if p.job.cancelled]
        for p in gone:
            self.queue.remove(p)
            log.info("%s dropped: its caller went away before it was done", type(p.job).__name__)
        if gone or not self.queue:
            return [(p.sink, Cancelled()) for p in gone]
        head = self.queue[0]
        with mx.stream(stream):
            if isinstance(head.job, ScoreJob):
                return self._score_chunk(lm, head, budget, prefix_cache)
            if isinstance(head.job, pair_forward.PairJob):
                return pair_forward.run_chunk(self.queue, lm, budget)
            if _long(lm, head.job, budget):
                return self._long_embed_chunk(lm, head, budget)
            return self._embed_chunk(lm, budget)

    # ---- embeddings -------------------------------------------------------------

    def _take_embeds(self, lm, budget: int) -> List[tuple]:
        """(job, first, end) slices of embedding inputs, oldest first, that padded together fit
        the budget (one input at least): a job with many inputs (a Rerank) may take several chunks."""
        return take_rows(self.queue, budget,
                         lambda p: isinstance(p.job, EmbedJob) and not _long(lm, p.job, budget))

    def _embed_chunk(self, lm, budget: int) -> List[tuple]:
        taken = self._take_embeds(lm, budget)

        def vectors(inputs):
            hidden, lengths = _hidden_states(lm, inputs)
            log.debug("embedding batch: %d inputs of %d jobs, padded to %d tokens",
                      len(lengths), len(taken), max(lengths))
            pooled, at = [], 0
            for p, a, b in taken:
                pooled.append(_pool(hidden[at:at + b - a], lengths[at:at + b - a], p.job.pooling, p.job.normalize))
                at += b - a
            mx.eval(pooled)  # every job's vectors in one evaluation
            return [v.tolist() for job_vectors in pooled for v in job_vectors]

        return run_rows(self.queue, taken, vectors, lambda p: EmbedResult(
            vectors=p.pooled, prompt_tokens=sum(len(t) for t in p.job.inputs)), "an embedding batch")

    def _long_embed_chunk(self, lm, p: _Pending, budget: int) -> List[tuple]:
        """One chunk of a causal LM input longer than the budget, continuing its KV cache."""
        tokens, pooling = p.job.inputs[0], p.job.pooling
        try:
            if p.cache is None:
                p.cache = make_prompt_cache(lm.model)
            end = min(len(tokens), p.done + budget)
            h = _inner(lm)(mx.array([tokens[p.done:end]]), cache=p.cache).astype(mx.float32)[0]
            if pooling == "mean":
                p.pooled = h.sum(axis=0) if p.pooled is None else p.pooled + h.sum(axis=0)
            elif pooling == "last":
                p.pooled = h[-1]
            elif pooling == "cls":
                p.pooled = h[0] if p.pooled is None else p.pooled
            else:
                p.pooled = (p.pooled or []) + [h]
            mx.eval(p.pooled, [c.state for c in p.cache])
            p.done = end
            if end < len(tokens):
                return []
            self.queue.remove(p)
            if pooling == "none":
                vectors = mx.concatenate(p.pooled, axis=0)
            else:
                vectors = (p.pooled / len(tokens) if pooling == "mean" else p.pooled)[None]
                if p.job.normalize:
                    vectors = vectors / mx.maximum(mx.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
            return [(p.sink, EmbedResult(vectors=[vectors.tolist()], prompt_tokens=len(tokens)))]
        except Exception as e:
            log.exception("embedding a %d-token input failed", len(tokens))
            if p in self.queue:
                self.queue.remove(p)
            return [(p.sink, e)]

    # ---- scores -----------------------------------------------------------------

    def _own_score_row(self, lm, p: _Pending) -> List[tuple]:
        """One row of a score in a fresh cache of its own, nothing kept in the prefix cache:
        the prompt and the row in one pass when the model's output depends on how a sequence
        is split (split_check.py), else the prompt then the row (a cache class that can
        neither be copied nor rebuilt from its state, prefix/kinds.py: deepseek_v41's LayerCache)."""
        job, row = p.job, p.rows_done
        cache = make_prompt_cache(lm.model)
        if p.whole:
            # The whole sequence, its last token too (it changes what earlier positions see in
            # such a model); the row's targets and first scored position move past the prompt.
            n = len(job.shared)
            job = dataclasses.replace(job, rows=[job.shared + job.rows[row] + job.targets[row][-1:]],
                                      targets=[[0] * n + job.targets[row]], first=[n + job.first[row]])
            row = 0
        elif job.shared:
            _body(lm)(mx.array([job.shared]), cache=cache)
        for tokens, logprobs in score_rows(lm, cache, job, row, row + 1, copies=False):
            p.out_tokens.append(tokens)
            p.out_logprobs.append(logprobs)
        p.rows_done += 1
        if p.rows_done < len(p.job.rows):
            return []
        self.queue.popleft()
        evaluated = len(p.job.rows) * len(p.job.shared) + sum(len(r) for r in p.job.rows)
        return [(p.sink, ScoreResult(p.out_tokens, p.out_logprobs, evaluated, 0))]

    def _score_chunk(self, lm, p: _Pending, budget: int, prefix_cache) -> List[tuple]:
        job = p.job
        try:
            if not p.started:  # the prefix cache is looked up when the job starts, not when it arrives
                p.started = True
                p.whole = split_sensitive(lm)
                p.plain = p.whole or kinds.unserved(make_prompt_cache(lm.model)) is not None
                if p.plain:
                    p.done = len(job.shared)
                else:
                    p.cache, p.cached = warm_cache(lm, prefix_cache(), job.shared)
                    p.done = p.cached
            if p.plain:
                return self._own_score_row(lm, p)
            if p.done < len(job.shared):  # one chunk of the shared prompt
                # A cache that cannot be trimmed is kept as it is at save_upto (a snapshot):
                # the chunk that reaches it ends there.
                snap = p.done < job.save_upto and snapshots.wanted_for(lm)
                end = min(job.save_upto if snap else len(job.shared), p.done + budget)
                # Its hidden states only: no position of the shared prompt is scored, so no
                # vocabulary-wide logits for it.
                _body(lm)(mx.array([job.shared[p.done:end]]), cache=p.cache)
                mx.eval([c.state for c in p.cache])
                p.done = end
                if snap and end == job.save_upto:
                    p.snapshot = snapshots.copied(p.cache)
                return []
            # Rows, as many as one bounded pass takes: each continues a copy of the shared prompt's KV.
            start = p.rows_done
            end = rows_end(lm, job, start, budget)
            for tokens, logprobs in score_rows(lm, p.cache, job, start, end):
                p.out_tokens.append(tokens)
                p.out_logprobs.append(logprobs)
            p.rows_done = end
            if end < len(job.rows):
                return []
            self.queue.popleft()
            save(prefix_cache(), lm, job, p.cache, p.snapshot)
            evaluated = len(job.shared) - p.cached + sum(len(r) for r in job.rows)
            return [(p.sink, ScoreResult(p.out_tokens, p.out_logprobs, evaluated, p.cached))]
        except Exception as e:
            log.exception("a score job of %d candidates failed", len(job.rows))
            if self.queue and self.queue[0] is p:
                self.queue.popleft()
            return [(p.sink, e)]


def chunk_plan(lm, configured: int, batch: Callable[[], Any]):
    """(tokens one chunk may take, what gives the prefix cache to share) for `lm`'s forward work."""
    if lm.serves.causal_forward:  # its chunk is its prefill chunk; it shares its batch's prefix cache
        return configured or batch().prefill_step_size, lambda: batch().cache
    return configured or 1024, lambda: None  # an encoder is small: more rows per pass


def _hidden_states(lm, inputs: List[List[int]]):
    """Final hidden states [rows, longest, width] of right-padded inputs, and each input's length."""
    lengths = [len(t) for t in inputs]
    width = max(lengths)
    encoder = lm.serves.encoder_forward
    pad = (lm.tokenizer.pad_token_id or 0) if encoder else 0
    ids = mx.array([t + [pad] * (width - len(t)) for t in inputs])
    if encoder:
        mask = mx.array([[1] * n + [0] * (width - n) for n in lengths])
        hidden = lm.model(ids, attention_mask=mask).last_hidden_state
    else:
        # A causal LM: padding on the right is never attended by the real tokens before it.
        hidden = _inner(lm)(ids)
    return hidden.astype(mx.float32), lengths


def _body(lm):
    """What runs a prompt into the cache without the vocabulary head, when the model has one."""
    inner = getattr(lm.model, "model", None)
    return lm.model if inner is None else inner


def _inner(lm):
    """A causal LM's body: token ids -> final normed hidden states (mlx-lm's `model.model`)."""
    inner = getattr(lm.model, "model", None)
    if inner is None:
        raise RuntimeError(f"{type(lm.model).__name__} exposes no hidden states to embed")
    return inner


def _long(lm, job, budget: int) -> bool:
    """A causal LM's single input longer than a chunk: embedded a chunk at a time (an encoder
    attends both ways and cannot be split)."""
    return lm.serves.causal_forward and isinstance(job, EmbedJob) and len(job.inputs) == 1 \
        and len(job.inputs[0]) > budget


def _pool(hidden, lengths: List[int], pooling: str, normalize: bool) -> list:
    """Per input, its vectors ([1, width], or [tokens, width] with pooling none), not yet evaluated."""
    if pooling == "none":
        return [hidden[i, :n] for i, n in enumerate(lengths)]
    n = mx.array(lengths)
    if pooling == "mean":  # over the real tokens only, not the padding
        mask = (mx.arange(hidden.shape[1])[None, :] < n[:, None]).astype(hidden.dtype)[..., None]
        v = (hidden * mask).sum(axis=1) / n[:, None].astype(hidden.dtype)
    elif pooling == "cls":
        v = hidden[:, 0]
    else:  # last
        v = hidden[mx.arange(len(lengths)), n - 1]
    if normalize:
        v = v / mx.maximum(mx.linalg.norm(v, axis=-1, keepdims=True), 1e-12)
    return [v[i:i + 1] for i in range(len(lengths))]
