"""Generation for a vision model: image prefill here, then the text batch's decoding.

mlx-vlm's own BatchGenerator shares one sampler across its batch and neither
takes nor returns per-request KV caches, so the decode side stays mlx-lm's
(text_batch) over the VLM's language model (vision_model.DecodeModel). What
differs is admission: the prompt's embeddings come from mlx-vlm's
`get_input_embeddings` (image features merged at the image tokens), the
language model is prefilled with them at the model's own positions
(multimodal RoPE for Qwen-style models), and the first token is sampled from
its last logits with the request's own sampler. The prefix cache is keyed by
the prompt with its media tokens replaced by content hashes (media.keyed_tokens):
a repeated image with the same prompt prefix is warm, a different image never
matches. Engine thread only.
"""

import inspect
import logging
from typing import Any, Callable, List, Optional, Tuple

import mlx.core as mx
from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

from sampling import SamplingParams, make_processors, make_sampler
from text_batch import First, TextBatch, _argmax, _unchanged, guarded

log = logging.getLogger("mlx-backend.vision")


class VisionBatch(TextBatch):
    def admit(self, prompt: List[int], max_tokens: int, sampling: SamplingParams, extra: List[Any],
              ignore_eos: bool, on_error: Callable[[Exception], None], direct: bool = False,
              media=None) -> Tuple[int, int, Optional[First]]:
        """As TextBatch.admit; every request is prefilled here (its images need the vision tower)."""
        key = media.key if media is not None else list(prompt)
        cache, rest = self.cache.fetch_nearest_cache(self.lm.epoch, key)
        if cache is not None and not rest:
            if can_trim_prompt_cache(cache):  # recompute the last token for its logits
                trim_prompt_cache(cache, 1)
                rest = key[-1:]
            else:
                cache, rest = None, key
        cached = len(prompt) - len(rest)
        cache = cache if cache is not None else self.lm.model.make_cache()
        sampler = make_sampler(sampling, len(self.lm.tokenizer))
        sampler = guarded(sampler, _argmax, on_error) if sampler else None
        processors = [guarded(p, _unchanged, on_error) for p in make_processors(sampling, extra)]
        with mx.stream(self.gen.stream):
            delta, token, logprobs = self._prefill(cache, prompt, cached, media, sampler, processors)
        cache[-1].set(delta, key)
        eos = token in self.lm.tokenizer.eos_token_ids and not ignore_eos
        finish = "stop" if eos else "length" if max_tokens <= 1 else None
        first = First(-1, token, logprobs, finish, cache, list(prompt))
        if finish:
            return -1, cached, first
        (uid,) = self.gen.insert(
            [[token]], max_tokens=[max_tokens - 1], caches=[cache], all_tokens=[list(prompt)],
            samplers=[sampler], logits_processors=[processors],
            stop_sequences=[self._no_stop if ignore_eos else self._eos])
        first.uid = uid
        return uid, cached, first

    def _prefill(self, cache, prompt: List[int], cached: int, media, sampler, processors):
        """Prefill prompt[cached:] into `cache` in chunks: (mRoPE delta, first token, its logprobs)."""
        decode = self.lm.model
        lm, kv = decode.lm, cache[:-1]
        ids = mx.array([prompt])
        arrays = {k: mx.array(v) for k, v in media.arrays.items()} if media is not None else {}
        positions, delta = None, 0
        if decode.mrope:  # positions of the whole prompt (the cached part included): no vision tower
            wanted = inspect.signature(lm.get_rope_index).parameters
            positions, deltas = lm.get_rope_index(ids, **{k: v for k, v in arrays.items() if k in wanted})
            delta = int(deltas.reshape(-1)[0].item()) if deltas is not None else 0
        embeds = None
        media_ids = set(self.lm.vision.media_token_ids)
        if media is not None and any(t in media_ids for t in prompt[cached:]):
            pixels = arrays.pop("pixel_values", None)
            embeds = decode.vlm.get_input_embeddings(ids, pixels, **arrays).inputs_embeds[:, cached:]
        n, step = len(prompt), self.prefill_step_size
        for start in range(cached, n, step):
            end = min(start + step, n)
            kwargs = {}
            if embeds is not None:
                kwargs["inputs_embeds"] = embeds[:, start - cached:end - cached]
            if positions is not None:
                kwargs["position_ids"] = positions[..., start:end]
            out = lm(ids[:, start:end], cache=kv, **kwargs)
            if end < n:
                mx.eval([c.state for c in kv])
        logits = getattr(out, "logits", out)[:, -1, :]
        context = mx.array(prompt, dtype=mx.int32)
        for p in processors:
            logits = p(context, logits)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        token = (sampler or _argmax)(logprobs)
        mx.eval(token, logprobs, [c.state for c in kv])
        return delta, int(token.item()), logprobs[0]

    def save(self, tokens: Optional[List[int]], cache: Optional[Any]) -> None:
        """Kept under the media-keyed prompt (from the cache's MediaState) plus what followed it."""
        if cache is None or not tokens:
            return
        key = cache[-1].key
        super().save(key + list(tokens[len(key):]), cache)
