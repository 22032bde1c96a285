"""Cross-encoder passes on the engine thread: (query, document) pairs -> relevance.

Pairs waiting together are right-padded into one batch up to the token budget,
whichever Rerank call they came from (as embedding inputs are), so concurrent
calls share a pass and running streams stall at most one chunk. The score is
sigmoid(logit) of the model's one-label head: the probability it stands for.
Engine thread only; jobs are built by forward_prep.pair_job.
"""

import logging
from dataclasses import dataclass
from typing import List, Optional

import mlx.core as mx

from engine.forward.row_batch import run_rows, take_rows

log = logging.getLogger("mlx-backend.forward")


@dataclass
class PairJob:
    inputs: List[List[int]]  # token ids of each (query, document) pair, as the tokenizer joins them
    types: Optional[List[List[int]]]  # their token_type_ids (segment A / B), when the tokenizer has them
    pad_id: int = 0
    model_epoch: int = 0
    label: str = ""
    cancelled: bool = False  # as forward.EmbedJob.cancelled
    id: int = 0


@dataclass
class PairResult:
    scores: List[float]  # per pair: sigmoid of its logit
    prompt_tokens: int


def _logits(lm, pairs: List[List[int]], types: Optional[List[List[int]]], pad_id: int):
    """One logit per pair of a right-padded batch (padding masked out, segment 0)."""
    width = max(len(t) for t in pairs)
    ids = mx.array([t + [pad_id] * (width - len(t)) for t in pairs])
    mask = mx.array([[1] * len(t) + [0] * (width - len(t)) for t in pairs])
    kwargs = {}
    if types is not None:
        kwargs["token_type_ids"] = mx.array([t + [0] * (width - len(t)) for t in types])
    out = lm.model(ids, attention_mask=mask, **kwargs)
    logits = getattr(out, "logits", out)
    if logits.ndim != 2 or logits.shape[-1] != 1:
        raise RuntimeError(f"the classifier gave logits of shape {logits.shape}, not one per pair")
    return logits[:, 0].astype(mx.float32)


def run_chunk(queue, lm, budget: int) -> List[tuple]:
    """One padded batch of pairs from the queue's pair jobs; the (sink, result) of each job it completed.
    A failure fails the jobs of this batch only (returned as (sink, exception) pairs)."""
    taken = take_rows(queue, budget, lambda p: isinstance(p.job, PairJob))
    head = taken[0][0].job

    def scores(pairs):
        types = None
        if head.types is not None:  # one model, one tokenizer: all jobs have them or none
            types = [t for p, a, b in taken for t in p.job.types[a:b]]
        out = mx.sigmoid(_logits(lm, pairs, types, head.pad_id))
        mx.eval(out)
        log.debug("cross-encoder batch: %d pairs of %d jobs, padded to %d tokens",
                  len(pairs), len(taken), max(len(t) for t in pairs))
        return out.tolist()

    return run_rows(queue, taken, scores, lambda p: PairResult(
        scores=p.pooled, prompt_tokens=sum(len(t) for t in p.job.inputs)), "a cross-encoder batch")
