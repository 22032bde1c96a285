"""The solo lane of a vision model: one request at a time through mlx-vlm's own generation step.

For a vision family the batch cannot serve as mlx-vlm does (a cache it cannot merge, an
embedding step longer than the prompt, image states read at every decode step) or whose
batched text differs from mlx-vlm's own (engine/lane_choice.py decides at load), each
request runs alone through `mlx_vlm.generate.generate_step` with the inputs preparation made (the processor's arrays,
the prompt's token ids, a mask of ones as the processor gives one prompt) and the request's
own sampler and logits processors; a request without media goes the same way, with no pixels.
mlx-vlm's step embeds and prefills the whole prompt in its first call (its own chunked
prefill over the image features), then gives one token a step.

No prefix cache: a vision family's language model keeps positions of the images it has seen
outside its cache (Qwen's multimodal RoPE state), which mlx-vlm's step sets from the whole
prompt; every prompt is prefilled whole. For the same reason each request starts from the
modules' state as loaded (loaders/fresh_state.py): what one generation left on them (Falcon
OCR's rope delta) must not reach the next. Engine thread only.
"""

from typing import Any, Iterator, List, Tuple

import mlx.core as mx

from engine.lanes import image_blocks
from engine.lanes.batch import Capabilities
from engine.lanes.sampling import argmax
from engine.lanes.solo import SoloBatch, _Run
from engine.lanes.vision_batch import engine_arrays


class SoloVisionBatch(SoloBatch):
    capabilities = Capabilities(max_running=1)  # no prefix cache to share with forward work

    def _store(self, entries: int, max_bytes: int, disk_bytes: int):
        return None

    def _new_cache(self) -> List[Any]:
        from mlx_vlm.models.cache import make_prompt_cache  # mlx-vlm's own cache classes, as its step makes them

        return make_prompt_cache(self.lm.vision.vlm.language_model)

    def _pieces(self, body: List[int], start: int, at: List[int]) -> List[List[int]]:
        return []  # mlx-vlm's step prefills the prompt itself, from its embeddings

    def _steps(self, run: _Run) -> Iterator[Tuple[int, Any]]:
        from mlx_vlm.generate import generate_step

        # From the model's state as loaded, as the library's generation in a process of its own starts:
        # a family that keeps state on its modules between generations gives the same text in any order.
        self.lm.vision.fresh.restore()
        parts = self.lm.vision
        arrays = engine_arrays(run.media)
        pixels = arrays.pop("pixel_values", None)
        ids = mx.array([run.prompt])
        if parts.both_ways and run.media is not None and set(run.prompt) & set(parts.both_ways):
            # The prompt but its last token prefilled here, each image attending both ways as the
            # family's reference does (image_blocks.py); then the library's step takes the last token
            # over that cache, as it does for a prompt whose prefix it holds.
            self._prefill_both_ways(run, ids, pixels, arrays)
            ids, pixels, arrays = ids[:, -1:], None, {}
        # An explicit sampler: left None, mlx-vlm would sample by the checkpoint's generation config.
        return generate_step(
            ids, parts.vlm, pixels, mx.ones(ids.shape, dtype=mx.int32), max_tokens=run.max_tokens,
            sampler=run.sampler or argmax, logits_processors=run.processors, prompt_cache=run.cache, **arrays)

    def _prefill_both_ways(self, run, ids, pixels, arrays) -> None:
        parts = self.lm.vision
        lm = parts.vlm.language_model
        mask = arrays.pop("attention_mask", None)
        embeds = parts.vlm.get_input_embeddings(ids, pixels, mask=mask, **arrays).inputs_embeds
        block = image_blocks.blocks(run.prompt, parts.both_ways)
        start, last = 0, len(run.prompt) - 1
        while start < last:
            end = min(image_blocks.chunk_end(block, start, self.prefill_step_size), last)
            if image_blocks.has_images(block, start, end):
                image_blocks.prefill(lm, embeds[:, start:end], run.cache, block, start, end)
            else:
                lm(ids[:, start:end], inputs_embeds=embeds[:, start:end], cache=run.cache)
            mx.eval([c.state for c in run.cache])
            start = end
