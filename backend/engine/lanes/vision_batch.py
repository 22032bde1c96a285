"""Generation for a vision model: image prefill here, then the text batch's decoding.

mlx-vlm's own BatchGenerator shares one sampler across its batch and neither
takes nor returns per-request KV caches, so the decode side stays mlx-lm's
(text_batch) over the VLM's language model (vision_model.DecodeModel). What
differs is the prefill: the prompt's embeddings come from mlx-vlm's
`get_input_embeddings` (image features merged at the image tokens), the
language model is prefilled with them at the model's own positions
(multimodal RoPE for Qwen-style models), and the first token is sampled from
its last logits with the request's own sampler; then the request joins the
batch as a one-token prompt over its filled cache.

A request admitted while nothing else runs is prefilled at once (the fastest
first token); otherwise its prefill advances one chunk per step, between
decode steps, so running streams pause at most one chunk (plus the vision
tower once). Our uids are our own: the batch generator's are mapped to them.

The prefix cache is keyed by the prompt with its media tokens replaced by
content hashes (media.keyed_tokens): a repeated image with the same prompt
prefix is warm, a different image never matches, in memory and on disk alike.
A cache read back from a file (engine/prefix/prompt_store.py) is one from memory:
`cached` counts the key's tokens it serves (the key is as long as the prompt),
the prefill starts there, positions and the mRoPE delta come from the whole
prompt, and its MediaState is set anew for this request before it joins the
batch (`_first`). Engine thread only.
"""

import inspect
import itertools
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import mlx.core as mx

from engine.lanes import image_blocks
from engine.lanes.batch import Capabilities
from engine.lanes.sampling import SamplingParams
from engine.lanes.text_batch import First, TextBatch, _argmax
from loaders.vision_model import each_array, run_layers, to_engine

log = logging.getLogger("mlx-backend.vision")


@dataclass
class _Prefill:
    """One request's prefill in progress."""
    uid: int
    prompt: List[int]
    key: List[int]
    cache: List[Any]
    at: int  # the next prompt position to prefill
    media: Any
    max_tokens: int
    ignore_eos: bool
    sampler: Any
    processors: List[Any]
    on_error: Callable[[Exception], None]
    started: bool = False
    embeds: Any = None  # inputs_embeds of prompt[embeds_from:], when the rest holds media
    embeds_from: int = 0
    # What else mlx-vlm's embedding step returned for the whole prompt (Qwen3-VL's deepstack
    # features and their positions, Gemma's per-layer inputs): its generation hands them to
    # every prefill chunk and the language model aligns them at its cache offset.
    features: Dict[str, Any] = field(default_factory=dict)
    positions: Any = None
    delta: int = 0
    blocks: Any = None  # image_blocks.blocks of the prompt, for a family that attends both ways in images


def engine_arrays(media) -> Dict[str, Any]:
    """A request's processor outputs (prepare/vision.py: numpy arrays, and lists or numbers as the
    processor made them) with MLX arrays made here, on the engine thread, in the same nesting."""
    return {k: each_array(v, to_engine) for k, v in media.arrays.items()} if media is not None else {}


class VisionBatch(TextBatch):
    capabilities = Capabilities()  # its caches carry image positions: no speculation, nothing shared

    def __init__(self, lm, **kwargs):
        super().__init__(lm, **kwargs)
        # No boundary snapshots here yet: every vision family served has a plain KV cache
        # (Gemma 3 vision, with sliding windows, is refused at LoadModel), so none could be tested.
        self.snapshots = False
        self._uids = itertools.count()
        self._pending: Deque[_Prefill] = deque()
        self._ours: Dict[int, int] = {}  # batch generator uid -> our uid
        self._gen_uid: Dict[int, int] = {}  # our uid -> batch generator uid

    def admit(self, prompt: List[int], max_tokens: int, sampling: SamplingParams, extra: List[Any],
              ignore_eos: bool, on_error: Callable[[Exception], None], direct: bool = False,
              media=None, boundaries=(), request=None) -> Tuple[int, int, Optional[First]]:
        """As TextBatch.admit; the first token comes back here when nothing else runs, else
        from a later step() once the prefill is done. `boundaries` is ignored (no snapshots
        here yet: see __init__)."""
        key = media.key if media is not None else list(prompt)
        cache, rest = self._nearest(key)
        cached = len(prompt) - len(rest)
        sampler, processors = self._guarded(sampling, extra, on_error)
        p = _Prefill(
            uid=next(self._uids), prompt=list(prompt), key=key,
            cache=cache if cache is not None else self.lm.model.make_cache(), at=cached, media=media,
            max_tokens=max_tokens, ignore_eos=ignore_eos,
            sampler=sampler, processors=processors,
            on_error=on_error)
        if self._ours or self._pending:
            self._pending.append(p)
            return p.uid, cached, None
        with mx.stream(self.gen.stream):
            first = None
            while first is None:
                first = self._advance(p)
        return (p.uid if first.finish_reason is None else -1), cached, first

    def _start(self, p: _Prefill) -> None:
        """Positions of the whole prompt and, when the rest holds media, its embeddings."""
        decode = self.lm.model
        lm = decode.lm
        ids = mx.array([p.prompt])
        arrays = engine_arrays(p.media)
        if decode.mrope:  # no vision tower needed for positions: a warm prefix skips it
            wanted = inspect.signature(lm.get_rope_index).parameters
            p.positions, deltas = lm.get_rope_index(ids, **{k: v for k, v in arrays.items() if k in wanted})
            p.delta = int(deltas.reshape(-1)[0].item()) if deltas is not None else 0
        media_ids = set(self.lm.vision.media_token_ids)
        if self.lm.vision.both_ways:
            p.blocks = image_blocks.blocks(p.prompt, self.lm.vision.both_ways)
        if p.media is not None and any(t in media_ids for t in p.prompt[p.at:]):
            pixels = arrays.pop("pixel_values", None)
            mask = arrays.pop("attention_mask", None)
            out = decode.vlm.get_input_embeddings(ids, pixels, mask=mask, **arrays)
            p.embeds = out.inputs_embeds[:, p.at:]
            p.embeds_from = p.at
            # Positions and their delta are the batch's own (above): a warm prefix needs them too.
            p.features = {k: v for k, v in out.to_dict().items()
                          if v is not None and k not in ("inputs_embeds", "position_ids", "rope_deltas")}
            mx.eval(p.embeds, list(p.features.values()))
        p.started = True

    def _advance(self, p: _Prefill) -> Optional[First]:
        """One prefill chunk; the first token (as a First) after the last one."""
        if not p.started:
            self._start(p)
        lm = self.lm.model.lm
        n = len(p.prompt)
        start, end = p.at, min(p.at + self.prefill_step_size, n)
        both_ways = p.blocks is not None and p.embeds is not None and image_blocks.has_images(p.blocks, start, n)
        if both_ways:  # a chunk never ends inside an image (its queries must see the whole block)
            end = image_blocks.chunk_end(p.blocks, start, self.prefill_step_size)
        kwargs = {}
        if p.embeds is not None:
            kwargs["inputs_embeds"] = p.embeds[:, start - p.embeds_from:end - p.embeds_from]
            kwargs.update(p.features)
        if p.positions is not None:
            # Qwen-VL's positions are (3, 1, length); ERNIE 4.5 VL's (1, length, 3): the prompt's axis
            # is the last unless the first is the batch of one.
            seq = (slice(None), slice(start, end)) if p.positions.shape[0] == 1 else (..., slice(start, end))
            kwargs["position_ids"] = p.positions[seq]
        if both_ways and image_blocks.has_images(p.blocks, start, end):
            out = image_blocks.prefill(lm, kwargs["inputs_embeds"], p.cache[:-1], p.blocks, start, end)
        else:
            out = run_layers(lm, mx.array([p.prompt[start:end]]), p.cache, **kwargs)
        p.at = end
        if end < n:
            mx.eval([c.state for c in p.cache[:-1]])
            return None
        logits = getattr(out, "logits", out)[:, -1, :]
        context = mx.array(p.prompt, dtype=mx.int32)
        for proc in p.processors:
            logits = proc(context, logits)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        token = (p.sampler or _argmax)(logprobs)
        mx.eval(token, logprobs, [c.state for c in p.cache[:-1]])
        return self._first(p, int(token.item()), logprobs[0])

    def _first(self, p: _Prefill, token: int, logprobs) -> First:
        """The first token; unless it ends the request, the request joins the decode batch."""
        p.cache[-1].set(p.delta, p.key)
        eos = token in self.lm.tokenizer.eos_token_ids and not p.ignore_eos
        finish = "stop" if eos else "length" if p.max_tokens <= 1 else None
        if finish is None:
            (g,) = self.gen.insert(
                [[token]], max_tokens=[p.max_tokens - 1], caches=[p.cache], all_tokens=[p.prompt],
                samplers=[p.sampler], logits_processors=[p.processors],
                stop_sequences=[self._no_stop if p.ignore_eos else self._eos])
            self._ours[g], self._gen_uid[p.uid] = p.uid, g
        return First(p.uid, token, logprobs, finish, p.cache, list(p.prompt))

    def step(self) -> list:
        """One decode step for every running request, then one chunk of the oldest prefill."""
        responses = []
        if self._ours:
            for r in super().step():
                r.uid = self._ours[r.uid]
                if r.finish_reason is not None:
                    self._forget(r.uid)
                responses.append(r)
        if self._pending:
            p = self._pending[0]
            try:
                with mx.stream(self.gen.stream):
                    first = self._advance(p)
            except Exception as e:  # this request alone fails; the batch goes on
                log.exception("vision prefill failed")
                self._pending.popleft()
                p.on_error(e)
                return responses
            if first is not None:
                self._pending.popleft()
                responses.append(first)
        return responses

    def prefill_left(self, uid: int) -> Optional[int]:
        return None  # its prefills run one chunk a step, oldest first, beside the library's batch

    def _forget(self, uid: int) -> None:
        g = self._gen_uid.pop(uid, None)
        self._ours.pop(g, None)

    def remove(self, uids: List[int], keep_cache: bool = False) -> Dict[int, Tuple[Any, List[int]]]:
        """Out of the batch or the prefill queue; with keep_cache, the caches of decoding ones."""
        gone = set(uids)
        self._pending = deque(p for p in self._pending if p.uid not in gone)
        pairs = [(self._gen_uid[u], u) for u in uids if u in self._gen_uid]
        for _, u in pairs:
            self._forget(u)
        if not pairs:
            return {}
        kept = self.gen.remove([g for g, _ in pairs], return_prompt_caches=keep_cache)
        return {u: kept[g] for g, u in pairs if g in kept}

    def save(self, tokens: Optional[List[int]], cache: Optional[Any]) -> None:
        """Kept under the media-keyed prompt (from the cache's MediaState) plus what followed it."""
        if cache is None or not tokens:
            return
        key = cache[-1].key
        super().save(key + list(tokens[len(key):]), cache)
